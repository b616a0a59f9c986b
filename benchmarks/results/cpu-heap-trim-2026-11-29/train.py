"""A user's CPU training loop, one model alone in the process: a one-layer LLTMLayer (ours) or
nn.LSTM (lstm) of the same sizes, a Linear head, MSE, Adam; fresh input each iteration.
python3 train.py T,B,I,S ours|lstm ITERATIONS -> the median time an iteration (after 10)."""
import sys, time, torch, pyroundlib, statistics
T,B,I,S = map(int, sys.argv[1].split(',')); who=sys.argv[2]; n=int(sys.argv[3])
torch.manual_seed(0)
rnn = pyroundlib.LLTMLayer(I, S) if who=='ours' else torch.nn.LSTM(I, S)
head = torch.nn.Linear(S, 1)
opt = torch.optim.Adam(list(rnn.parameters())+list(head.parameters()), 1e-3)
ts=[]
for it in range(n):
    x = torch.randn(T,B,I); y = torch.randn(B,1)
    t=time.perf_counter()
    out,_ = rnn(x)
    loss = torch.nn.functional.mse_loss(head(out[-1]), y)
    opt.zero_grad(); loss.backward(); opt.step()
    ts.append(time.perf_counter()-t)
print(who, sys.argv[1], 'median ms/iter %.3f' % (statistics.median(ts[10:])*1e3))
