"""VectorCode's operations on 64 bytes at a time (the K-quants' super-blocks): a mixin of VectorCode
(vector.py), which it extends with these methods; they emit IR through VectorCode's own helpers."""

from __future__ import annotations

from llvmlite import ir


class WideOps:
    # -- 64 bytes at a time (the K-quants' super-blocks): dot_pairs / scale_pairs on 512-bit vectors where
    # the target has AVX-512 BW (one instruction for two 32-weight sub-blocks), else on two 256-bit halves;
    # the lanes are the same integers either way --

    def dot_pairs_wide(self, unsigned_bytes, signed_bytes):
        """<64 x i8> (as unsigned, <= 127) * <64 x i8> (signed) -> <32 x i16>: adjacent products summed."""
        if self.avx512_bw:
            args = [unsigned_bytes, signed_bytes]
            return self._x86("llvm.x86.avx512.pmaddubs.w.512", args, self.vector_type(32, 16))
        halves = [
            self.dot_pairs(self.shuffle(unsigned_bytes, range(32 * i, 32 * i + 32)), self.shuffle(signed_bytes, range(32 * i, 32 * i + 32)))
            for i in range(2)
        ]
        return self.join(*halves)

    def scale_pairs_wide(self, pairs, scales):
        """<32 x i16> * <32 x i16> -> <16 x i32>: adjacent products summed."""
        if self.avx512_bw:
            return self._x86("llvm.x86.avx512.pmaddw.d.512", [pairs, scales], self.vector_type(16, 32))
        halves = [
            self.scale_pairs(self.shuffle(pairs, range(16 * i, 16 * i + 16)), self.shuffle(scales, range(16 * i, 16 * i + 16)))
            for i in range(2)
        ]
        return self.join(*halves)

    def scaled_quads_wide(self, runs, scales):
        """Two runs of 64 weights against their activations, scaled: runs = ((q0, a0), (q1, a1)), each
        <64 x i8> (quants unsigned, activations signed, 4 * max q * 128 < 2^15) -> <16 x i32> partial
        sums of scale * product over all 128 products, for the target with AVX-512 VNNI: one vpdpbusd
        per run (int32 lanes of 4 products each, which fit in int16), one vpackssdw of the two (exact),
        one vpmaddwd by `scales`, the words quad_scales lays out. Three 512-bit multiplies for 128
        weights where dot_pairs_wide + scale_pairs_wide take four: Q4_K's batched kernels 7-10% faster
        per row on Zen 4 (which executes one such multiply per cycle). The partial sums are spread over
        the lanes differently from the other way; their total is the same integer."""
        zero = self.constant(0, 16, 32)
        quads = [self._vpdpbusd(zero, q, a) for q, a in runs]
        words = self._x86("llvm.x86.avx512.packssdw.512", quads, self.vector_type(32, 16))
        return self._x86("llvm.x86.avx512.pmaddw.d.512", [words, scales], self.vector_type(16, 32))

    def quad_scales(self, words8, scale_of):
        """The scales operand of scaled_quads_wide: word w = words8[scale_of(which, element)] for the
        run (0 or 1) and the first of the 4 elements whose products word w holds. vpackssdw interleaves
        its sources per 128-bit lane: four int32 lanes of the first run, then four of the second."""
        picks = []
        for w in range(32):
            block, i = divmod(w, 8)
            which, lane = (0, 4 * block + i) if i < 4 else (1, 4 * block + i - 4)
            picks.append(scale_of(which, 4 * lane))
        return self.pick_words(words8, picks)

    def bit_fields_wide(self, vec, low_bits, high_bits):
        """vec (<32 x i8>) -> <64 x i8>: in the first 32 lanes bits low_bits[j] of each byte moved to bit
        j, in the last 32 bits high_bits[j] (every other bit 0). With GFNI (and AVX-512 BW) one
        gf2p8affineqb on vec in both halves, whose bit matrix is per 64-bit lane; else masks and shifts."""
        if self.gfni and self.avx512_bw:
            both = self.join(vec, vec)
            matrix = []
            for fields in (low_bits, high_bits):
                rows = [0] * 8  # result bit i = parity(matrix byte 7 - i AND x)
                for j, bit in fields.items():
                    rows[7 - j] = 1 << bit
                matrix += rows * 4
            return self._x86("llvm.x86.vgf2p8affineqb.512", [both, ir.Constant(both.type, matrix), ir.Constant(ir.IntType(8), 0)], both.type)
        halves = []
        for fields in (low_bits, high_bits):
            masks = {}  # bits moved by the same distance: one mask and one shift
            for j, bit in fields.items():
                masks[j - bit] = masks.get(j - bit, 0) | 1 << bit
            result = None
            for move, mask in masks.items():
                field = self.and_(vec, mask)
                field = self.shl(field, move) if move > 0 else self.shr(field, -move) if move < 0 else field
                result = field if result is None else self.or_(result, field)
            halves.append(result)
        return self.join(*halves)

    def pick_words(self, words8, picks):
        """<8 x i16> words8 -> <32 x i16>, lane i = words8[picks[i]]. With AVX-512 BW words8 is broadcast
        to the four 128-bit lanes once (the caller's several picks share it) and each pick is one in-lane
        vpshufb; elsewhere a shuffle."""
        if not self.avx512_bw:
            return self.shuffle(words8, picks)
        both = self.bitcast(self.shuffle(words8, list(range(8)) * 4), 64, 8)
        control = ir.Constant(both.type, [2 * picks[i // 2] + i % 2 for i in range(64)])
        return self.bitcast(self._x86("llvm.x86.avx512.pshuf.b.512", [both, control], both.type), 32, 16)

    def sum_two(self, a, b):
        """The (wrapping) lane sums of two integer vectors of one type, by one halving tree for both."""
        builder = self.builder
        lanes = a.type.count
        vec = builder.add(
            builder.shuffle_vector(a, b, self._lane_list(list(range(lanes // 2)) + list(range(lanes, lanes + lanes // 2)))),
            builder.shuffle_vector(a, b, self._lane_list(list(range(lanes // 2, lanes)) + list(range(lanes + lanes // 2, 2 * lanes)))),
        )
        while vec.type.count > 2:  # lanes [a's | b's], each half halved in place
            quarter = vec.type.count // 4
            first = [i for h in (0, 2 * quarter) for i in range(h, h + quarter)]
            vec = builder.add(self.shuffle(vec, first), self.shuffle(vec, [i + quarter for i in first]))
        i32 = ir.IntType(32)
        return builder.extract_element(vec, i32(0)), builder.extract_element(vec, i32(1))
