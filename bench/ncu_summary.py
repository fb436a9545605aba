# Summarise an Nsight Compute CSV (gpu__time_duration.sum per kernel) by kernel name:
# total microseconds and launches per name, largest first; with a second argument, every
# launch in order. Usage: python3 bench/ncu_summary.py ncu.csv [seq]
import csv,re,collections,sys
rows=list(csv.reader(open(sys.argv[1])))
hdr=None;data=[]
for r in rows:
    if r and r[0]=='ID': hdr=r; continue
    if hdr and len(r)==len(hdr): data.append(dict(zip(hdr,r)))
tot=collections.OrderedDict()
seq=[]
for d in data:
    name=d['Kernel Name']; v=float(d['Metric Value'].replace(',','')); unit=d['Metric Unit']
    v = v/1000 if unit in('ns','nsecond') else (v*1000 if unit in ('ms','msecond') else v)
    k=re.sub(r'\(.*','',name)
    k=re.sub(r'mxlab::(cuda::)?(<unnamed>|\(anonymous namespace\))::','',k)[:100]
    tot.setdefault(k,[0,0]); tot[k][0]+=v; tot[k][1]+=1
    seq.append((v,k,d['Grid Size'],d['Block Size']))
s=0
for k,(v,c) in sorted(tot.items(), key=lambda x:-x[1][0]):
    print(f"{v:9.1f} us  {c:4d}  {k}"); s+=v
print("total",s, "kernels", len(data))
if len(sys.argv)>2:
    for v,k,g,b in seq: print(f"{v:8.1f} {g:>14} {b:>12} {k}")
