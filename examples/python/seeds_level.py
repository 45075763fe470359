# The seeds' objects over NumPy: a K4/V3 cache with update_and_fetch / trim / state, attention, W8A8 and quantize.
import pickle
import numpy as np
import cider

rng = np.random.default_rng(0)
cache = cider.KVCache(k_bits=4, v_bits=3, group_size=64, rotation="so4-full")  # the seeds' K4/V3 cache
k, v = rng.standard_normal((2, 1, 8, 300, 128), dtype=np.float32)
(kq, ks, kb), (vq, vs, vb) = cache.update_and_fetch(k, v)
q = rng.standard_normal((1, 32, 1, 128), dtype=np.float32)                  # GQA: 32 query heads over 8
out = cider.attention(q, cache, scale=128 ** -0.5)
cache.trim(44)
restored = pickle.loads(pickle.dumps(cache))                                 # state / meta_state round trip
layer = cider.Int8Linear.from_float(rng.standard_normal((256, 128), dtype=np.float32), group_size=64)
w_q, scales, biases = cider.quantize(rng.standard_normal((256, 128), dtype=np.float32), group_size=64, bits=4)
print(kq.shape, vq.shape, out.shape, restored.offset, restored.meta_state[:3], cache.nbytes, layer, w_q.shape)
