#!/usr/bin/env python3
"""Writes a copy of a GGUF model with only its first N blocks (block_count rewritten, blk.K.* for K >= N dropped),
tensor data copied from the source (zeros where the source is a sparse/zero-filled partial download).
Usage: shrink_gguf.py SRC DST N"""
import struct, sys
src, dst, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
f = open(src, 'rb')
magic = f.read(4); ver, nt, nkv = struct.unpack('<IQQ', f.read(20))
fm = {0:'B',1:'b',2:'H',3:'h',4:'I',5:'i',6:'f',7:'?',10:'Q',11:'q',12:'d'}
def rs():
    n, = struct.unpack('<Q', f.read(8)); return f.read(n)
def skipv(t):
    if t in fm: f.read(struct.calcsize('<'+fm[t])); return
    if t == 8: rs(); return
    at, n = struct.unpack('<IQ', f.read(12))
    if at in fm: f.read(n*struct.calcsize('<'+fm[at])); return
    for _ in range(n): skipv(at)
kvs = []; align = 32
for _ in range(nkv):
    start = f.tell(); k = rs(); t, = struct.unpack('<I', f.read(4)); vstart = f.tell(); skipv(t); end = f.tell()
    f.seek(start); raw = f.read(end-start)
    if k.endswith(b'.block_count'):
        raw = raw[:vstart-start] + struct.pack('<I', keep)
    if k == b'general.alignment':
        f.seek(vstart); align, = struct.unpack('<I', f.read(4)); f.seek(end)
    kvs.append(raw)
ts = {0:(1,4),1:(1,2),2:(32,18),3:(32,20),6:(32,22),7:(32,24),8:(32,34),10:(256,84),11:(256,110),12:(256,144),13:(256,176),14:(256,210),15:(256,292),30:(1,2)}
tensors = []
for _ in range(nt):
    name = rs(); nd, = struct.unpack('<I', f.read(4)); dims = struct.unpack('<'+'Q'*nd, f.read(8*nd)); t, off = struct.unpack('<IQ', f.read(12))
    n = 1
    for d in dims: n *= d
    b, s = ts[t]; tensors.append((name, dims, t, off, n//b*s))
data0 = (f.tell()+align-1)//align*align
kept = [x for x in tensors if not (x[0].startswith(b'blk.') and int(x[0].split(b'.')[1]) >= keep)]
hdr = bytearray(magic + struct.pack('<IQQ', ver, len(kept), nkv) + b''.join(kvs))
off = 0; layout = []
for name, dims, t, o, size in kept:
    hdr += struct.pack('<Q', len(name)) + name + struct.pack('<I', len(dims)) + struct.pack('<'+'Q'*len(dims), *dims) + struct.pack('<IQ', t, off)
    layout.append((o, size)); off = (off+size+align-1)//align*align
hdr += b'\0' * ((-len(hdr)) % align)
with open(dst, 'wb') as out:
    out.write(hdr)
    for o, size in layout:
        f.seek(data0+o); out.write(f.read(size)); out.write(b'\0'*((-size) % align))
print(f"{len(kept)} of {nt} tensors, {keep} blocks -> {dst}")
