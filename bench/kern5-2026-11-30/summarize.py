import sys,glob,re,statistics as st
def load(pat):
    d={}
    for f in sorted(glob.glob(pat)):
        cur=None
        for l in open(f):
            p=l.split()
            if l.startswith('mlx q4'):
                cur=(p[2],p[3]); v=[float(p[4+2*i]) for i in range(4)]; d.setdefault(cur,{'r':[], 'm':[], 'a':[]})['a'].append(v)
            elif l.startswith(' (MLX order)') and cur:
                m=[float(p[3+2*i]) for i in range(4)]; d[cur]['m'].append(m); d[cur]['r'].append([a/b for a,b in zip(d[cur]['a'][-1],m)])
    return d
A=load(sys.argv[1]); B=load(sys.argv[2])
print("shape | b1 A->B GB/s (x, rows16/MLX ratio A->B) | b2 | b4 | b8")
for k in A:
    out=[]
    for i in range(4):
        a=st.median(x[i] for x in A[k]['a']); b=st.median(x[i] for x in B[k]['a'])
        ra=st.median(x[i] for x in A[k]['r']); rb=st.median(x[i] for x in B[k]['r'])
        out.append(f"{a:.1f} -> {b:.1f} ({ra:.2f} -> {rb:.2f}: {rb/ra:.2f}x)")
    print(f"| q4 {k[0]} {k[1]} | "+" | ".join(out)+" |")
