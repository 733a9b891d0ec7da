# Nsight Compute summaries of the decode kernels (device machine, repo root): the carried kernel
# microbenchmarks (.devcarry/bench, library in .devcarry/gtest/lib) under ncu --set full for the
# first launch(es) of a kernel; full reports go to $OUT, the key lines (throughputs, issue
# activity, occupancy, instruction counts) to stdout. Clocks are left alone (--clock-control none).
#   bash bench/ncu_kernels.sh
L=$PWD/.devcarry/gtest/lib
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
K="Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Issued Ipc Active|Eligible Warps"
K="$K|No Eligible|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Executed Instructions  |Grid Size"
K="$K|Avg. Not Predicated"
for spec in ${NCU_GEMV:-"wo_b wq_b"}; do
  LD_LIBRARY_PATH=$L timeout 240 "$NCU" --clock-control none --set full -k "regex:${NCU_GEMV_KERNEL:-decode_gemv_kernel}" \
    -c 1 .devcarry/bench/decode_gemv_bench --only "$spec" >"$OUT/ncu_gemv_$spec.txt" 2>&1
  echo "=== decode GEMV, $spec, m 1"
  grep -E "$K" "$OUT/ncu_gemv_$spec.txt" | head -40
done
LD_LIBRARY_PATH=$L timeout 240 "$NCU" --clock-control none --set full -k regex:expert_kernel -c 2 \
  .devcarry/bench/moe_decode_bench --quick >"$OUT/ncu_moe.txt" 2>&1
echo "=== MoE expert kernels, S 1 (gate/up, down)"
grep -E "$K|expert_kernel" "$OUT/ncu_moe.txt" | head -60
