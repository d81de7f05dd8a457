"""Temporary: bf16 attention of one query and argmax, this machine's CPU."""
import subprocess, time
import torch
import torch.nn.functional as F
out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
print([l.split(":")[1].strip() for l in out.splitlines() if l.startswith("Model name")], "amx" if "amx_bf16" in out else "no amx", torch.__version__)
torch.set_num_threads(1)
def bench(f, n=300):
    for _ in range(30): f()
    t = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t) / n * 1e6
for S in (64, 256, 1024):
    kb = torch.randn(1, 6, 1024, 64).to(torch.bfloat16); vb = torch.randn_like(kb)
    q = torch.randn(1, 6, 1, 64).to(torch.bfloat16); k = kb[:, :, :S]; v = vb[:, :, :S]
    a = bench(lambda: F.scaled_dot_product_attention(q, k, v))
    b = bench(lambda: F.scaled_dot_product_attention(q.float(), k.float(), v.float()).to(torch.bfloat16))
    print(S, "keys: bf16 sdpa %.1f us, fp32 flash on upcast %.1f us" % (a, b))
l = torch.randn(1, 50257).to(torch.bfloat16)
print("argmax of 50257 bf16 %.1f us, upcast + argmax %.1f us" % (bench(lambda: l.argmax(-1)), bench(lambda: l.float().argmax(-1))))
