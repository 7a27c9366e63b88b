set -u
O=$OUT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1
mkdir -p $O/a $O/b
NCCL_TIDE_EAGER_GRAPHS=1 OUT=$O/a TIDE_GPU_TESTS="test_eager_graphs:90" TIDE_GPU_BENCH="host_issue" TIDE_GPU_DEADLINE_S=215 bash ci/gpu_job.sh 2>&1 | grep -v "^TIDE/" | tail -40
export PYTHONPATH=$PWD/pytorch_glue:$PWD/tests/gpu NCCL_TIDE_LIBRARY_PATH=$PWD/build/gpu/libnccl-tide.so
if ! grep -q "test_eager_graphs: rc 0" $O/a/summary.txt; then
  NCCL_TIDE_EAGER_GRAPHS=1 NCCL_TIDE_DEBUG=TRACE NCCL_TIDE_DEBUG_SUBSYS=ALL timeout -k 5 40 python3 -m pytest -s -x -q -p no:cacheprovider tests/gpu/test_eager_graphs.py -k "all_gather and 8" > /tmp/trace.log 2>&1; echo "trace rc $?"; tail -c 40000 /tmp/trace.log > $O/trace_tail.log
fi
echo "=== probe trim on $(date +%T)"
timeout -k 5 170 python3 benchmarks/fsdp_memory_probe.py --variants stock,tide --slot-pool 2 --slot-trim on --timeout 140 --out $O/probe_trim_on.json > $O/probe_trim_on.log 2>&1; echo "probe rc $?"; grep -v "^TIDE/" $O/probe_trim_on.log | head -12
echo "=== fsdp_native $(date +%T)"
timeout -k 5 100 python3 -m pytest -q -rs -p no:cacheprovider -o faulthandler_timeout=85 tests/gpu/test_fsdp_native.py > $O/fsdp_native.log 2>&1; echo "fsdp_native rc $?"; grep -v "^TIDE/" $O/fsdp_native.log | tail -15
echo "=== fsdp_step trim on $(date +%T)"
timeout -k 5 110 python3 -m nccl_tide.bench.fsdp_step --layers 4 --variants stock,tide --slot-pool 2 --slot-trim on --warmup 3 --steps 10 --variant-timeout 45 -J $O/fsdp_step_trim_on.json > $O/fsdp_step_trim_on.log 2>&1; echo "step rc $?"; grep -v "^TIDE/" $O/fsdp_step_trim_on.log | tail -10
echo "=== end $(date +%T)"
