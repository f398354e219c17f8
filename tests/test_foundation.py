import dataclasses

import pandas as pd
import pytest

from tuner import shapetable
from tuner.cli import main
from tuner.device import SPEC_PROFILES, load_profile, save_profile
from tuner.errors import TunerError
from tuner.spaces import SearchSpace


def test_cli_help_lists_every_stage(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("harvest", "budget", "estimate", "device", "bench", "search", "rank", "export", "run"):
        assert cmd in out


def test_shapetable_roundtrip_keeps_contract_columns(tmp_path):
    row = {c: 0 for c in shapetable.COLUMNS}
    row.update(op="aten::mm", family="gemm", phase="decode", dtype="bfloat16", layout="NT",
               kernels="k", source="t", device="d", m=4, n=896, k=896, batch=1, calls=10)
    df = pd.DataFrame([row])
    path = shapetable.write(df, tmp_path / "s.parquet")
    back = shapetable.read(path)
    assert list(back.columns) == list(shapetable.COLUMNS)
    assert back.loc[0, "n"] == 896 and str(back["m"].dtype) == "int64"


def test_shapetable_missing_columns_is_a_user_error(tmp_path):
    with pytest.raises(TunerError, match="lacks columns"):
        shapetable.normalize(pd.DataFrame({"op": ["aten::mm"]}))
    with pytest.raises(TunerError, match="not found"):
        shapetable.read(tmp_path / "nope.parquet")


def test_device_profile_save_load_and_spec(tmp_path):
    prof = dataclasses.replace(SPEC_PROFILES["h200"], name="NVIDIA H200", source="measured")
    path = save_profile(prof, tmp_path)
    assert path.name == "nvidia-h200.json"
    assert load_profile(path) == prof
    assert load_profile("nvidia-h200", tmp_path) == prof
    assert load_profile("mi300x").warp_size == 64
    with pytest.raises(TunerError, match="unknown device profile"):
        load_profile("tpu9", tmp_path)


def test_search_space_constraints_filter_configs():
    space = SearchSpace("x", "cuda", {"A": [1, 2, 4], "B": [8, 16]}, ("A * B <= k",))
    configs = space.configs({"k": 16})
    assert {"A": 2, "B": 16} not in configs and {"A": 2, "B": 8} in configs
    assert len(configs) == 3
