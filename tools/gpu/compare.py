"""One table of cider's CUDA times beside the PyTorch peers measured in the same job.
usage: compare.py cuda_bench.json gpu_anchors.json [more_peers.json ...]   (each cider case names its peer row in
"peer"; the peer files are merged, later ones win)"""
import json, sys

ours = json.load(open(sys.argv[1]))
peers = {}
for f in sys.argv[2:]:
    peers.update(json.load(open(f)))
print(f"{'cider case':52s} {'cider us':>9s} {'peer':48s} {'peer us':>9s} {'cider/peer':>10s}")
for name, r in ours.items():
    p = peers.get(r.get("peer", ""))
    if not p:
        continue
    print(f"{name:52s} {r['s']*1e6:9.2f} {r['peer']:48s} {p['s']*1e6:9.2f} {r['s']/p['s']:10.3f}")
