"""Decoder-only GPT with GPT-2-style or Llama-style blocks.

    model = GPT(ModelConfig(style="llama", n_layer=2, n_head=4, d_model=128, vocab_size=257))
    out = model(input_ids, labels=labels)       # out.loss, out.logits

Construction allocates nothing on the meta device (`with torch.device("meta"): GPT(cfg)` is instant
for any flavor, which the memory estimator relies on); `init_weights()` (re)initialises every
parameter and buffer in place after `to_empty()`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dsrecipes.models.config import ModelConfig, validate_model_config
from dsrecipes.models.document_attention import document_causal_mask, rope_at
from dsrecipes.models.layers import Block, RMSNorm, make_norm, model_rope_tables
from dsrecipes.models.moe import Experts, MoELayer
from dsrecipes.models.moe_config import MoEConfig, validate_moe_config


def _without_constructor_draws():
    """Fork the random state of the CPU and of the default device (CUDA) around module construction."""
    device = torch.get_default_device()
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type=device.type)


def _normal(tensor: torch.Tensor, std: float, draw_device: torch.device) -> None:
    """N(0, std) into `tensor`; a meta tensor draws into a dropped scratch copy on draw_device, so the random
    stream advances exactly as if it were materialised."""
    if tensor.is_meta:
        torch.empty(tensor.shape, dtype=tensor.dtype, device=draw_device).normal_(0.0, std)
    else:
        nn.init.normal_(tensor, mean=0.0, std=std)


@dataclass
class GPTOutput:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class GPT(nn.Module):
    # Hook: loss_fn(logits [N, V], labels [N]) -> mean CE over labels != -100 (fp32); None = F.cross_entropy
    # on fp32 logits. Set by kernel injection (dsrecipes.models.kernel_injection).
    loss_fn = None
    # Ranks the sequence of the activations between blocks is split over (tensor parallelism's
    # sequence-parallel layout sets it): a pipeline stage's input holds seq / activation_seq_shards rows.
    activation_seq_shards = 1

    def __init__(self, cfg: ModelConfig, moe: MoEConfig | None = None):
        super().__init__()
        validate_model_config(cfg)
        if cfg.runs_transformers:
            raise ValueError(f"model.style=hf is the Hugging Face module of {cfg.path}, not dsrecipes' GPT; build it "
                             "with dsrecipes.models.hf_module.build_hf_module")
        if cfg.vocab_size is None:
            raise ValueError("model.vocab_size is null; set it or let the recipe take it from the tokenizer")
        self.cfg = cfg
        self.moe_cfg = moe if moe is not None and moe.enabled else None
        if self.moe_cfg is not None:
            validate_moe_config(self.moe_cfg, cfg, world_size=self.moe_cfg.ep_size)
        moe_ids = set(self.moe_cfg.moe_layer_ids(cfg.n_layer)) if self.moe_cfg else set()
        # torch's layers draw their default initialisation while they are built, which init_weights then
        # overwrites; those draws are kept off the random stream, so that init_weights starts from the same
        # state whether the model is built for real or on the meta device (pipeline ranks, which build only
        # their stages: dsrecipes.distributed.pipeline_parallel.materialize_pipeline_rank)
        with _without_constructor_draws():
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model) if cfg.style == "gpt2" else None
            self.emb_dropout = nn.Dropout(cfg.dropout)
            self.blocks = nn.ModuleList(
                Block(cfg, MoELayer(cfg, self.moe_cfg) if i in moe_ids else None) for i in range(cfg.n_layer)
            )
            self.final_norm = make_norm(cfg)
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        if cfg.style == "llama":
            cos, sin = model_rope_tables(cfg)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        if not any(p.is_meta for p in self.parameters()):
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2 initialisation: N(0, init_std), output projections scaled by 1/sqrt(2*n_layer).

        Parameters left on the meta device (those another pipeline rank holds, see
        dsrecipes.distributed.pipeline_parallel.materialize_pipeline_rank) draw their values into a scratch
        tensor that is dropped, so every parameter this rank does hold gets exactly the single process's values.
        """
        std = self.cfg.init_std
        draw_device = next((p.device for p in self.parameters() if not p.is_meta), torch.device("cpu"))
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                is_output_proj = name.endswith(("out_proj", "fc_out"))
                scale = 1.0 / math.sqrt(2 * self.cfg.n_layer) if is_output_proj else 1.0
                _normal(module.weight, std * scale, draw_device)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                _normal(module.weight, std, draw_device)
            elif isinstance(module, Experts):
                module.reset_parameters(draw_device=draw_device)
            elif isinstance(module, (nn.LayerNorm, RMSNorm)) or callable(getattr(module, "reset_parameters", None)):
                module.reset_parameters()  # norms, including fused ones swapped in by kernel injection
        self.init_rope()

    @torch.no_grad()
    def init_rope(self) -> None:
        """(Re)compute the rotary tables in place (they are not saved in state dicts)."""
        if self.cfg.style == "llama":
            cos, sin = model_rope_tables(self.cfg, self.rope_cos.device)
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, position_offset: int = 0,
        position_ids: torch.Tensor | None = None,
    ) -> GPTOutput:
        """input_ids, labels: [batch, seq] token ids; the loss is mean cross-entropy over all labels != -100.

        position_offset: position of input_ids' first token (positions offset .. offset+seq-1 for the
        position embedding / rotary tables); a sequence-parallel rank holding chunk r of T/P tokens
        passes r*T/P (dsrecipes.distributed.sequence_parallel).
        position_ids: [batch, seq] positions of rows holding packed documents (data.packing=documents): they
        restart at 0 with each document, and each document attends only to itself
        (dsrecipes.models.document_attention).
        """
        positions, rope, mask = self._positions(input_ids.shape[1], int(position_offset), position_ids,
                                                input_ids.device)
        x = self.tok_emb(input_ids)
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions)
        x = self.emb_dropout(x)
        extra = {"attn_mask": mask} if mask is not None else {}  # as Block passes it on: only when there is one
        for block in self.blocks:
            x = block(x, rope, **extra)
        logits, loss = self.head_and_loss(x, labels)
        return GPTOutput(logits=logits, loss=loss)

    def _positions(self, seq_len: int, position_offset: int, position_ids: torch.Tensor | None, device):
        """(positions for the position embedding, rotary tables or None, document mask or None) of forward's input:
        positions offset .. offset+seq-1 with causal attention, or packed documents' own positions, each attending
        inside its document."""
        rope = None
        if position_ids is not None:
            if int(position_ids.max()) >= self.cfg.max_seq_len:
                raise ValueError(f"position_ids reach {int(position_ids.max())}, beyond model.max_seq_len="
                                 f"{self.cfg.max_seq_len}")
            if self.cfg.style == "llama":
                rope = rope_at(self.rope_cos, self.rope_sin, position_ids)
            return position_ids, rope, document_causal_mask(position_ids)
        if position_offset < 0 or position_offset + seq_len > self.cfg.max_seq_len:
            raise ValueError(
                f"positions {position_offset}..{position_offset + seq_len - 1} (sequence length {seq_len}, "
                f"position_offset {position_offset}) exceed model.max_seq_len={self.cfg.max_seq_len}"
            )
        end = position_offset + seq_len
        if self.cfg.style == "llama":  # tables sliced from the offset: blocks see rows 0.. as positions offset..
            rope = (self.rope_cos[position_offset:end], self.rope_sin[position_offset:end])
        positions = torch.arange(position_offset, end, device=device) if self.pos_emb is not None else None
        return positions, rope, None

    def head_and_loss(self, x: torch.Tensor, labels: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Final norm, LM head and (with labels) the loss: one method, so compile=blocks can compile it as a unit."""
        logits = self.lm_head(self.final_norm(x))
        loss = None
        if labels is not None and self.loss_fn is not None:
            loss = self.loss_fn(logits.flatten(0, 1), labels.flatten())
        elif labels is not None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
        return logits, loss

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (a tied weight counts once).

        non_embedding drops the lookup-only tables: position embeddings, and the token embedding
        when it is not tied (a tied one is also the LM head's matmul weight, so it stays).
        """
        total = sum(p.numel() for p in self.parameters())
        if non_embedding:
            if self.pos_emb is not None:
                total -= self.pos_emb.weight.numel()
            if not self.cfg.tie_embeddings:
                total -= self.tok_emb.weight.numel()
        return total

    def num_active_params(self, non_embedding: bool = False) -> int:
        """Parameters one token computes with: an MoE layer's experts count k/E of their size."""
        total = self.num_params(non_embedding)
        for experts in (m for m in self.modules() if isinstance(m, Experts)):
            size = sum(p.numel() for p in experts.parameters()) * experts.global_experts // experts.num_experts
            total -= size - size * self.moe_cfg.k // experts.global_experts
        return total

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token: 6N (forward+backward matmuls, N = active non-embedding parameters)
        + 12*L*d*T (attention scores)."""
        seq_len = seq_len or self.cfg.max_seq_len
        return 6.0 * self.num_active_params(non_embedding=True) + 12.0 * self.cfg.n_layer * self.cfg.d_model * seq_len
