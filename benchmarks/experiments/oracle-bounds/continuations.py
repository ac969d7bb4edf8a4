"""Distinct continuations after 1-3-token keys of the HumanEval answers in the code datastore (RESULTS, READER oracle)."""
import json, numpy as np, os
from specgraft.retrieval import Datastore
from specgraft.cli.datastore import load_tokenizer
tok=load_tokenizer("qwen2.5-coder-1.5b-instruct")
DS=os.path.expanduser("~/.cache/specgraft/datastores/code")
ds=Datastore.load(DS, tokenizer=tok)
rows=[json.loads(l) for l in open('benchmarks/experiments/adapld-reader/raw/results-issue13/reader-answers-humaneval6-zen5/results.jsonl')]
outs=[r['tokens'] for r in rows if r['method']=='ar' and r['turn']==0][:6]
for k in (1,2,3):
    n=[]
    for o in outs:
        for i in range(k, len(o)):
            key=o[i-k:i]
            lo,hi=ds.key_range(key)
            if lo<hi:
                c=ds._count(k,lo,hi); n.append(len(c))
            else: n.append(0)
    n=np.array(n); print(k, "keys",len(n),"found",(n>0).mean().round(2),"distinct continuations median/p75/p90", np.median(n[n>0]), np.quantile(n[n>0],.75), np.quantile(n[n>0],.9))
