import timeit, torch, pyroundlib, statistics as st
from pyroundlib import round as R
print(torch.__version__, torch.get_num_threads())
for dt in (torch.float32, torch.float64):
  for n in (2**16, 2**18, 2**20):
    x=(torch.randn(n)*4).to(dt); y=torch.empty_like(x)
    pyroundlib.round_ste(x)
    k=R._round_kernel; code=R.DTYPE_CODES[dt]
    cases={
     "torch.round": lambda: torch.round(x),
     "torch.round out": lambda: torch.round(x,out=y),
     "round_ste": lambda: pyroundlib.round_ste(x),
     "op no_autograd": lambda: torch.ops.pyroundlib.round_ste_no_autograd.default(x),
     "_round_op": lambda: R._round_op(x),
     "kernel call": lambda: k(x, x.data_ptr(), y.data_ptr(), n, code),
     "bare ctypes": (lambda f=k._cpu: f(x.data_ptr(), y.data_ptr(), n, code)),
    }
    res={}
    for rep in range(5):
      for name,f in cases.items():
        res.setdefault(name,[]).append(min(timeit.repeat(f, number=500, repeat=3))/500*1e6)
    print(dt, n, "  ".join(f"{name} {st.median(v):.2f}" for name,v in res.items()))
