"""The kernel families' search spaces: one YAML file per family (<family>.yaml).

A package only so that the YAML files ship with `pip install .` and load through
`importlib.resources` (tuner/spaces.py); there is no code here.
"""
