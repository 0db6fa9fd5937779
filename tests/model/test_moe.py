"""Mixtures of experts (localllm/model/moe.py): routing worked out by hand, a chat and a server on tiny
MoE files. The logits are checked against llama.cpp's (test_llamacpp_archs.py) and the float64
reference (test_archs.py); batched steps against single sequences in test_paged.py."""

from __future__ import annotations


import numpy as np
import pytest

import localllm
from localllm.errors import GGUFError
from localllm.model.moe import MoEParams, expert_weights, group_by_expert

from chat_checks import chat_replies
from server_checks import concurrent_equals_alone
from tiny_models import write_tiny_model


def params(n_used=2, gating="softmax", norm=False, n_expert=4):
    return MoEParams(n_expert=n_expert, n_used=n_used, n_ff=256, n_ff_shared=0, gating=gating, norm_weights=norm)


def test_softmax_routing_picks_the_top_k_in_order_with_their_probabilities():
    # scores ln 1, ln 4, ln 2, ln 3: probabilities 0.1, 0.4, 0.2, 0.3
    scores = np.log(np.array([[1.0, 4.0, 2.0, 3.0]], dtype=np.float32))
    chosen, weights = expert_weights(scores, params())
    assert chosen.tolist() == [[1, 3]]
    np.testing.assert_allclose(weights, [[0.4, 0.3]], rtol=1e-6)
    chosen, weights = expert_weights(scores, params(norm=True))  # renormalised over the two: 4/7, 3/7
    np.testing.assert_allclose(weights, [[4 / 7, 3 / 7]], rtol=1e-6)


def test_sigmoid_routing_and_the_floor_of_a_vanishing_weight_sum():
    scores = np.array([[0.0, -40.0, -50.0]], dtype=np.float32)
    chosen, weights = expert_weights(scores, params(n_used=1, gating="sigmoid", n_expert=3))
    assert chosen.tolist() == [[0]] and weights[0, 0] == np.float32(0.5)
    # sigmoid(-40) ~ 4e-18 and sigmoid(-50) ~ 2e-22: their sum is below float16's smallest normal, which
    # llama.cpp divides by instead (6.1e-5), so the weights stay tiny rather than becoming ~1
    _, weights = expert_weights(scores[:, 1:], params(n_used=2, gating="sigmoid", norm=True, n_expert=2))
    assert weights.max() < 1e-12


def test_rows_are_grouped_by_expert_and_each_pair_finds_its_row():
    chosen = np.array([[2, 0], [0, 3], [2, 3]], dtype=np.int32)  # tokens 0..2, two experts each
    weights = np.array([[0.6, 0.4], [0.7, 0.3], [0.5, 0.5]], dtype=np.float32)
    routes = group_by_expert(chosen, weights, n_expert=4, shared=np.array([0.9, 0.8, 0.7], np.float32))
    assert routes.groups.tolist() == [0, 2, 3]  # expert 1 unused: not read
    assert routes.bounds.tolist() == [0, 2, 4, 6]
    assert routes.pair_rows.tolist() == [0, 1, 0, 2, 1, 2]  # expert 0: tokens 0, 1; 2: 0, 2; 3: 1, 2
    # slot (t, j) is the sorted pair of token t's j-th expert; the shared expert's rows follow the six
    assert routes.slots.tolist() == [[2, 0, 6], [1, 4, 7], [3, 5, 8]]
    assert routes.weights[:, 2].tolist() == pytest.approx([0.9, 0.8, 0.7])


def test_an_moe_architecture_without_experts_is_refused(tmp_path):
    path = write_tiny_model(tmp_path / "dense.gguf", "qwen3", "F32")
    from localllm.gguf import GGUFReader, GGUFWriter  # rewrite the dense file as qwen3moe

    with GGUFReader(path) as reader:
        writer = GGUFWriter(tmp_path / "moe.gguf")
        for key, value in reader.metadata.items():
            key = key.replace("qwen3.", "qwen3moe.")
            writer.add(key, "qwen3moe" if key == "general.architecture" else value)
        for name in reader.tensors:
            info = reader.tensors[name]
            writer.add_tensor(name, np.array(reader.tensor_bytes(name)), info.ggml_type.name, shape=info.shape)
        writer.write()
    with pytest.raises(GGUFError, match="expert_count.*must be > 0"):
        localllm.load(str(tmp_path / "moe.gguf"))


def test_chat_on_a_tiny_mixture_of_experts(tmp_path):
    """`localllm chat` streams a reply and /regen at temperature 0 reproduces it (Qwen3-MoE, Q8_0)."""
    path = write_tiny_model(tmp_path / "tiny-qwen3moe.gguf", "qwen3moe", "Q8_0", seed=3)
    replies = chat_replies(path, ("▁ab▁cd▁ef", "/regen", "/regen"), tmp_path)
    assert replies[0].strip() and replies[1] == replies[2]


def test_concurrent_requests_on_a_tiny_mixture_of_experts_each_equal_the_request_alone(tmp_path):
    """The server's batched steps (rows of several sequences routed to experts together) give each
    request the greedy tokens Model.generate gives it alone (Qwen2-MoE with its shared expert, Q4_K)."""
    path = write_tiny_model(tmp_path / "tiny-qwen2moe.gguf", "qwen2moe", "Q4_K", seed=4)
    concurrent_equals_alone(path, [[2, *range(300 + 7 * i, 305 + 7 * i + i)] for i in range(4)])


def test_show_counts_every_expert_for_the_file_and_the_used_ones_per_token(tmp_path):
    from localllm.gguf import GGUFReader
    from localllm.model.info import describe

    path = write_tiny_model(tmp_path / "olmoe.gguf", "olmoe", "F32")  # 2 layers, 8 experts of 512, 3 per token
    with GGUFReader(path) as reader:
        info = describe(reader)
        expert_bytes = sum(t.nbytes for t in reader.tensors.values() if "_exps" in t.name)
        embd_row = reader.tensors["token_embd.weight"].row_bytes
        all_bytes = sum(t.nbytes for t in reader.tensors.values())
    per_layer_experts = 3 * 256 * 512 * 8  # gate, up, down; F32
    assert (info["n_expert"], info["n_expert_used"]) == (8, 3)
    assert info["parameters"] - info["active_parameters"] == 2 * per_layer_experts * 5 // 8
    embd_bytes = 256 * 384 * 4  # the table a token takes one row of (the file has output.weight)
    assert info["bytes_per_token"] == all_bytes - expert_bytes * 5 // 8 - embd_bytes + embd_row
    assert expert_bytes == 2 * per_layer_experts * 4
