#!/usr/bin/env python3
"""The peer for cuda_gemm bench (issue 39's micro-batch claim), measured in the same GPU run.

PyTorch on the same shapes: BF16 `x @ w.T`; FP8 E4M3 with per-tensor scales through
`torch._scaled_mm` (fast accumulation off and on); and FP8 with the activation's quantization
(amax, scale, cast from fp32 — eager PyTorch, three kernels) before the GEMM; and MXFP8 the
Hopper way (1x32 blocks quantized in eager PyTorch, dequantized to bf16, the BF16 GEMM). Peaks: one 8192^3
GEMM each. Every time is CUDA-event device time over repetitions after a warm-up, like
cuda_gemm's. torchao is reported if importable (its version), not benchmarked.

    python3 tools/gpu_torch_peer.py [--quick] [--json FILE]
"""
import argparse
import json
import sys

LINEARS = [  # (model, linear, N, K): cuda_gemm.cpp's kLinears
    ("SmolLM2-135M", "q_proj/o_proj", 576, 576),
    ("SmolLM2-135M", "k_proj/v_proj", 192, 576),
    ("SmolLM2-135M", "gate/up_proj", 1536, 576),
    ("SmolLM2-135M", "down_proj", 576, 1536),
    ("SmolLM2-135M", "lm_head", 49152, 576),
    ("Qwen3-8B", "q_proj/o_proj", 4096, 4096),
    ("Qwen3-8B", "k_proj/v_proj", 1024, 4096),
    ("Qwen3-8B", "gate/up_proj", 12288, 4096),
    ("Qwen3-8B", "down_proj", 4096, 12288),
    ("Qwen3-8B", "lm_head", 151936, 4096),
]
TOKENS = [1, 16, 64, 256, 1024, 4096, 16384]
E4M3_MAX = 448.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="M up to 1024 only")
    ap.add_argument("--json", help="write the results as JSON lines")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("gpu_torch_peer: skipped: no PyTorch")
        return 77
    if not torch.cuda.is_available():
        print("gpu_torch_peer: skipped: torch sees no CUDA device")
        return 77
    try:
        import torchao  # noqa: F401
        torchao_version = getattr(torchao, "__version__", "present")
    except ImportError:
        torchao_version = "not installed"
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}, torchao {torchao_version}")
    out = open(args.json, "w") if args.json else None

    def emit(record):
        if out:
            out.write(json.dumps(record) + "\n")

    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)

    def time_ms(fn, budget_ms=100.0):
        fn()
        torch.cuda.synchronize()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        one = max(start.elapsed_time(stop), 1e-3)
        reps = min(max(int(budget_ms / one), 3), 50)
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / reps

    largest = 1024 if args.quick else 16384
    gen = torch.Generator(device=dev).manual_seed(8)
    one = torch.tensor(1.0, device=dev)

    def fp8(t):
        return (t * (E4M3_MAX / t.abs().amax())).to(torch.float8_e4m3fn)

    def tflops(m, n, k, ms):
        return 2.0 * m * n * k / (ms * 1e9)

    p = 8192
    a = torch.randn(p, p, device=dev, generator=gen)
    a16, a8 = a.to(torch.bfloat16), fp8(a)
    peak_bf16 = tflops(p, p, p, time_ms(lambda: a16 @ a16.T, 300))
    peak_fp8 = tflops(p, p, p, time_ms(lambda: torch._scaled_mm(a8, a8.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), 300))
    peak_fast = tflops(p, p, p, time_ms(lambda: torch._scaled_mm(a8, a8.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True), 300))
    del a, a16, a8
    print(f"measured peaks (8192^3, bf16 out): BF16 {peak_bf16:.0f} TFLOP/s, FP8 {peak_fp8:.0f}, FP8 fast-accum {peak_fast:.0f}")
    emit({"peak": True, "bf16_tflops": peak_bf16, "fp8_tflops": peak_fp8, "fp8_fast_tflops": peak_fast, "torch": torch.__version__})
    print(f"{'model':13} {'linear':14} {'M':>6} | {'bf16 us':>9} {'fp8 us':>9} {'fp8f us':>9} {'q+fp8 us':>9} {'mx8 us':>9} | {'bf16%':>6} {'fp8%':>6} {'fp8f%':>6} | speed")
    for model, name, n, k in LINEARS:
        w = torch.randn(n, k, device=dev, generator=gen)
        w16, w8 = w.to(torch.bfloat16), fp8(w)
        sw = (w.abs().amax() / E4M3_MAX).float()
        del w
        crossover = None
        for m in TOKENS:
            if m > largest:
                continue
            x = torch.randn(m, k, device=dev, generator=gen)
            x16, x8 = x.to(torch.bfloat16), fp8(x)
            sx = (x.abs().amax() / E4M3_MAX).float()

            def quant_then_gemm():
                amax = x.abs().amax()
                xq = (x * (E4M3_MAX / amax)).to(torch.float8_e4m3fn)
                return torch._scaled_mm(xq, w8.T, scale_a=(amax / E4M3_MAX).float(), scale_b=sw, out_dtype=torch.bfloat16)

            def mx8_then_gemm():
                # MXFP8 the Hopper way in eager PyTorch: 1x32 blocks along K, the OCP floor rule
                # (scale 2^(floor(log2 amax) - 8), e4m3's emax 8), saturating cast, values back
                # to bf16 (exact), then the BF16 GEMM against the weight's bf16 (as cuda_gemm's mx8).
                # The same values as concord's mxfp8-e4m3 (this rule in numpy + ml_dtypes equals
                # concord.numerics.fake_quantize on Gaussian rows of scales 2^-20..2^20).
                xb = x.reshape(m, k // 32, 32)
                amax = xb.abs().amax(dim=-1, keepdim=True)
                e = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 8, torch.zeros_like(amax))
                scale = torch.exp2(e.clamp(-127, 127))
                q = (xb / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
                xq = (q.to(torch.bfloat16) * scale.to(torch.bfloat16)).reshape(m, k)
                return xq @ w16.T

            try:  # a shape torch refuses (e.g. an M its FP8 path does not take) does not end the table
                t16 = time_ms(lambda: x16 @ w16.T)
                t8 = time_ms(lambda: torch._scaled_mm(x8, w8.T, scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16))
                tf = time_ms(lambda: torch._scaled_mm(x8, w8.T, scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16,
                                                      use_fast_accum=True))
                tq = time_ms(quant_then_gemm)
                tm = time_ms(mx8_then_gemm)
            except RuntimeError as e:
                print(f"{model:13} {name:14} {m:6d} | failed: {str(e).splitlines()[0]}")
                continue
            speed = t16 / tq
            if crossover is None and speed > 1.0:
                crossover = m
            print(f"{model:13} {name:14} {m:6d} | {t16 * 1e3:9.1f} {t8 * 1e3:9.1f} {tf * 1e3:9.1f} {tq * 1e3:9.1f} {tm * 1e3:9.1f} | "
                  f"{100 * tflops(m, n, k, t16) / peak_bf16:5.1f}% {100 * tflops(m, n, k, t8) / peak_fp8:5.1f}% "
                  f"{100 * tflops(m, n, k, tf) / peak_fast:5.1f}% | {speed:.2f}x")
            emit({"model": model, "linear": name, "M": m, "N": n, "K": k, "bf16_ms": t16, "fp8_ms": t8,
                  "fp8_fast_ms": tf, "quant_fp8_ms": tq, "mxfp8_bf16_ms": tm})
            del x, x16, x8
        print(f"{model:13} {name:14} crossover (FP8 with its quantization faster than BF16): "
              f"{'none up to the largest M' if crossover is None else f'M = {crossover}'}")
        del w16, w8
        torch.cuda.empty_cache()
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
