#!/usr/bin/env bash
# SPLIT_K_UP on the H200: the moe GPU tests, then tuner bench at m = 1 and 8 (Qwen3-30B-A3B experts)
LOG=$OUT/split_up.log
source scripts/gpu/setup.sh
stamp "gpu tests"
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_moe_gpu.py 2>&1 | tail -n 6 | tee -a "$LOG"
S=experts=128,topk=8,hidden=2048,inter=768
C=BLOCK_SIZE_M=16,GROUP_SIZE_M=1
stamp "bench m=1"
timeout 100 python3 -m tuner.cli bench --family moe --shape m=1,$S --device $DEV --groups 8 --replays 8 \
  --config $C,BLOCK_SIZE_N=256,BLOCK_SIZE_K=64,SPLIT_K=2,SPLIT_K_UP=1,num_warps=8,num_stages=5 \
  --config $C,BLOCK_SIZE_N=256,BLOCK_SIZE_K=64,SPLIT_K=2,SPLIT_K_UP=2,num_warps=8,num_stages=4 \
  --config $C,BLOCK_SIZE_N=256,BLOCK_SIZE_K=64,SPLIT_K=2,SPLIT_K_UP=4,num_warps=8,num_stages=3 \
  --config $C,BLOCK_SIZE_N=128,BLOCK_SIZE_K=64,SPLIT_K=2,SPLIT_K_UP=2,num_warps=4,num_stages=4 \
  --config $C,BLOCK_SIZE_N=128,BLOCK_SIZE_K=64,SPLIT_K=2,SPLIT_K_UP=4,num_warps=4,num_stages=3 \
  --config $C,BLOCK_SIZE_N=64,BLOCK_SIZE_K=64,SPLIT_K=2,SPLIT_K_UP=4,num_warps=4,num_stages=3 \
  > $OUT/bench_m1.log 2>&1; echo "rc $?" | tee -a "$LOG"
stamp "bench m=8"
timeout 70 python3 -m tuner.cli bench --family moe --shape m=8,$S --device $DEV --groups 8 --replays 8 \
  --config $C,BLOCK_SIZE_N=64,BLOCK_SIZE_K=64,SPLIT_K=1,SPLIT_K_UP=2,num_warps=4,num_stages=3 \
  --config $C,BLOCK_SIZE_N=128,BLOCK_SIZE_K=64,SPLIT_K=2,SPLIT_K_UP=2,num_warps=4,num_stages=4 \
  > $OUT/bench_m8.log 2>&1; echo "rc $?" | tee -a "$LOG"
stamp done
