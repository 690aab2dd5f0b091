#!/bin/sh
# A GPU load for gpu-check's second half, where the machine offers one: PyTorch fp16 matmuls.
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  exec python3 -c "
import torch, time
a = torch.randn(8192, 8192, device='cuda', dtype=torch.float16)
b = torch.randn(8192, 8192, device='cuda', dtype=torch.float16)
t = time.time()
while time.time() - t < 120:
    c = a @ b
torch.cuda.synchronize()
"
fi
echo "no load available here (no PyTorch with CUDA)"
exit 3
