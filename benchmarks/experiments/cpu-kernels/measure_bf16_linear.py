"""bf16-stored weights computed in fp32 on an AVX2 CPU (issue 14, part 3): is it faster?

The catalog models' weights are bf16 values; today each linear holds them upcast to fp32 in
oneDNN's packed layout. A kernel reading the bf16 bits and accumulating in fp32 computes the
same function from half the bytes. No maintained kernel does that here: oneDNN's packed bf16
weights need AVX512-BF16/AVX-NE-CONVERT (this prints the error torch gives), its weight
decompression is for int8/int4 weights, and ``F.linear`` on a per-call upcast copies the whole
weight. So this compiles ``bf16_linear.c`` (AVX2 + FMA, OpenMP; each output summed in the same
order whatever the number of rows) with the machine's ``gcc`` into a temporary directory and
times 1 / 4 / 8 / 16-row forwards of one ``[rows, 1536] x [1536, 8960]`` linear against the
prepacked fp32 ``OneDNNLinear``, interleaved, medians::

    OMP_NUM_THREADS=2 python benchmarks/experiments/cpu-kernels/measure_bf16_linear.py --repeats 40

It also prints the largest difference from the fp32 result and whether each row's output is
the same computed alone (what greedy losslessness needs from a kernel).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch


def build(tmp: Path) -> ctypes.CDLL:
    lib = tmp / "libbf16_linear.so"
    source = Path(__file__).with_name("bf16_linear.c")
    subprocess.run(["gcc", "-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", str(source), "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))


def main() -> None:
    from specgraft.models.kernels import OneDNNLinear

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-features", type=int, default=1536)
    parser.add_argument("--out-features", type=int, default=8960)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    K, N = args.in_features, args.out_features
    assert K % 8 == 0 and N % 2 == 0, "the kernel takes in_features % 8 == 0 and even out_features"
    torch.manual_seed(0)
    w_bf16 = (torch.randn(N, K) * 0.02).bfloat16()
    linear = torch.nn.Linear(K, N, bias=False)
    linear.weight.data.copy_(w_bf16.float())  # what the model holds today: the bf16 values in fp32
    packed = OneDNNLinear(linear)
    bits = w_bf16.view(torch.int16).contiguous()
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(Path(tmp))

        def bf16_kernel(x: torch.Tensor) -> torch.Tensor:
            y = torch.empty(x.shape[0], N)
            lib.bf16_linear(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(bits.data_ptr()), ctypes.c_void_p(y.data_ptr()), x.shape[0], N, K)
            return y

        try:
            torch.ops.mkldnn._reorder_linear_weight(w_bf16, 32)
        except RuntimeError as e:
            print("oneDNN packed bf16 weight:", str(e).splitlines()[0])
        rows = (1, 4, 8, 16)
        xs = {m: torch.randn(m, K) for m in rows}
        candidates = {"fp32 packed (oneDNN)": packed, "bf16 weights, AVX2 kernel": bf16_kernel}
        times: dict[tuple[str, int], list[float]] = {(c, m): [] for c in candidates for m in rows}
        with torch.no_grad():
            for m in rows:
                y, ref = bf16_kernel(xs[m]), packed(xs[m])
                alone = torch.cat([bf16_kernel(xs[m][i : i + 1]) for i in range(m)])
                print(f"{m:>2} rows: max |bf16 kernel - fp32| {(y - ref).abs().max().item():.1e} "
                      f"(outputs up to {ref.abs().max().item():.1f}); bitwise equal: {torch.equal(y, ref)}; rows independent: {torch.equal(y, alone)}")
            for repeat in range(args.repeats + 3):
                for m in rows:
                    for name, fn in candidates.items():
                        t0 = time.perf_counter()
                        fn(xs[m])
                        if repeat >= 3:
                            times[name, m].append(time.perf_counter() - t0)
    for name in candidates:
        cells = " / ".join(f"{statistics.median(times[name, m]) * 1e3:.2f}" for m in rows)
        print(f"{name:>26}: {cells} ms for {' / '.join(map(str, rows))} rows")


if __name__ == "__main__":
    main()
