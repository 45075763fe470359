"""One table of cider's CUDA times beside the PyTorch peers' (tools/gpu/peers.py), best measured in the same job.
usage: compare.py FILE.json...   cuda_bench --json files (their entries name a peer row in "peer") and peer files
(tools/gpu/peers.py --json), in any order; within each kind, later files win. Works on the files of a GPU job's
archive (gpu-job.tar.gz) too, from different jobs if need be (then the ratios mix two runs)."""
import json
import sys

if len(sys.argv) < 2:
    sys.exit(__doc__)
ours, peers = {}, {}
for f in sys.argv[1:]:
    for name, r in json.load(open(f)).items():
        (ours if "peer" in r else peers)[name] = r
print(f"{'cider case':64s} {'cider us':>9s} {'peer':52s} {'peer us':>9s} {'cider/peer':>10s}")
missing = set()
for name, r in ours.items():
    if not r.get("peer"):
        continue
    p = peers.get(r["peer"])
    if not p:
        missing.add(r["peer"])
        continue
    print(f"{name:64s} {r['s']*1e6:9.2f} {r['peer']:52s} {p['s']*1e6:9.2f} {r['s']/p['s']:10.3f}")
if missing:
    print(f"(no peer row for: {', '.join(sorted(missing))})")
