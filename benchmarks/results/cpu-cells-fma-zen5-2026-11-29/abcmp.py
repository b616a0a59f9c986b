import sys, json, statistics as st, collections
d=collections.defaultdict(lambda: collections.defaultdict(list))
libs=[]
for line in open(sys.argv[1]):
    lib, js = line.split(" ",1)
    if lib not in libs: libs.append(lib)
    for k,v in json.loads(js).items(): d[k][lib].append(v)
a,b=libs[:2]
print("row", "A", "B", "B/A")
for k in d:
    ma, mb = st.median(d[k][a]), st.median(d[k][b])
    print(f"{k:32s} {ma:.3f} {mb:.3f} {mb/ma:.3f}")
