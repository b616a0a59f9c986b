import torch, pyroundlib
torch.backends.cuda.matmul.allow_tf32 = False
T, B, I, S = 1000, 16, 64, 64
for dtype in (torch.float32,):
    x = torch.randn(T, B, I, device="cuda", dtype=dtype)
    w = torch.randn(3 * S, S + I, device="cuda", dtype=dtype) * S ** -0.5
    b = torch.randn(3 * S, device="cuda", dtype=dtype)
    h0 = torch.randn(B, S, device="cuda", dtype=dtype); c0 = torch.randn(B, S, device="cuda", dtype=dtype)
    with torch.inference_mode():
        for _ in range(3):
            pyroundlib.lltm_sequence(x, w, b, (h0, c0))
    torch.cuda.synchronize()
