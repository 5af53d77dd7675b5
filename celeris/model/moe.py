"""The feed-forward layers: the dense SwiGLU MLP and the sparse mixture of experts.

A mixture-of-experts layer (Shazeer et al. 2017; DeepSeekMoE, Dai et al. 2024, for shared
experts and group-limited routing) sends each token through ``num_experts_per_tok`` of
``num_experts`` SwiGLU experts chosen by a router, weighs their outputs and adds the shared
experts every token passes through. The families differ only in the router
(``CelerisConfig``'s router fields):

- LLaDA2.x: sigmoid scores; ``expert_bias`` is added only to *choose* experts: the
  ``router_groups`` groups are ranked by the sum of their two best biased scores, the best
  ``router_topk_groups`` are kept, the top-k biased scores among them are the experts; their
  weights are the unbiased scores, normalised and scaled by ``routed_scaling_factor``.
- LLaDA-MoE: softmax probabilities plus ``expert_bias``; the top-k sums are both the choice
  and the weights (not normalised).
- SDAR-MoE (Qwen3-MoE): softmax, top-k, renormalised to sum 1 when ``norm_topk_prob``.

Experts are stored stacked, (E, 2I, C) gate/up and (E, C, I) down, so a CUDA step runs them
as two grouped matrix products (``torch._grouped_mm``) over the tokens sorted by expert, with
no host sync; elsewhere a loop over the experts that received tokens computes the same sums
(the reference twin, held equal to the grouped path in the tests).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), the dense MLP of every family and each shared expert."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """Scores the experts for each token and picks ``top_k`` of them with their weights."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size))   # (E, C)
        # a parameter, not a buffer: transformers 5 builds modules on the meta device and
        # would leave a buffer missing from the checkpoint silently zero
        self.expert_bias = (nn.Parameter(torch.zeros(cfg.num_experts), requires_grad=False)
                            if cfg.router_bias != "none" else None)
        self.top_k, self.score, self.bias_use = (cfg.num_experts_per_tok, cfg.router_score,
                                                 cfg.router_bias)
        self.groups, self.topk_groups = cfg.router_groups, cfg.router_topk_groups
        self.normalise, self.scale = cfg.norm_topk_prob, cfg.routed_scaling_factor
        self.fp32 = cfg.router_fp32

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (N, C) -> expert ids (N, k) and their float32 weights (N, k)."""
        if self.fp32:       # LLaDA2 computes its gate logits in float32
            logits = F.linear(x.float(), self.weight.float())                      # (N, E)
        else:
            logits = F.linear(x, self.weight).float()
        scores = logits.softmax(-1) if self.score == "softmax" else logits.sigmoid()
        bias = None if self.expert_bias is None else self.expert_bias.float()
        if self.bias_use == "add":
            scores = scores + bias
        choice = scores + bias if self.bias_use == "select" else scores
        if self.groups > 1:
            choice = self._keep_best_groups(choice)
        idx = choice.topk(self.top_k, dim=-1).indices                             # (N, k)
        weights = scores.gather(-1, idx)
        if self.normalise:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return idx, weights * self.scale

    def _keep_best_groups(self, choice: torch.Tensor) -> torch.Tensor:
        """-inf for the experts outside the ``topk_groups`` groups whose two best scores sum
        highest (group-limited routing)."""
        N, E = choice.shape
        grouped = choice.view(N, self.groups, E // self.groups)                    # (N, G, E/G)
        group_score = grouped.topk(2, dim=-1).values.sum(-1)                       # (N, G)
        best = group_score.topk(self.topk_groups, dim=-1).indices                  # (N, TG)
        keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, best, True)
        return grouped.masked_fill(~keep[..., None], float("-inf")).view(N, E)


class Experts(nn.Module):
    """E stacked SwiGLU experts: ``gate_up_proj`` (E, 2I, C) holds each expert's gate rows
    then its up rows, ``down_proj`` (E, C, I) (nn.Linear's (out, in) per expert). ``act`` is
    the gate's activation (SiLU; DiffusionGemma's experts use tanh-approximated GELU)."""

    def __init__(self, cfg, act=F.silu) -> None:
        super().__init__()
        self.act = act
        E, C, I = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, C))
        self.down_proj = nn.Parameter(torch.empty(E, C, I))
        self.grouped: bool | None = None     # None: grouped products on CUDA, loop elsewhere

    def forward(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor
                ) -> torch.Tensor:
        """x (N, C), idx/weights (N, k) -> sum over k of weight * expert(x), (N, C)."""
        N, k = idx.shape
        order = idx.flatten().argsort(stable=True)                                 # (N k,)
        token = order // k                           # the token of each sorted assignment
        # rows per expert; not torch.bincount, which on CUDA reads the ids' range back to
        # the host (a sync per MoE layer)
        flat = idx.flatten()
        counts = torch.zeros(self.gate_up_proj.shape[0], dtype=torch.long,
                             device=idx.device).scatter_add_(0, flat, torch.ones_like(flat))
        xs = x[token]                                                              # (N k, C)
        grouped = self.grouped if self.grouped is not None else x.is_cuda
        if grouped and hasattr(torch, "_grouped_mm"):
            ys = self._grouped(xs, counts)
        else:
            ys = self._loop(xs, counts)
        ys = ys * weights.flatten()[order, None].to(ys.dtype)
        return torch.zeros_like(x).index_add_(0, token, ys.to(x.dtype))

    def _loop(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The reference: one SwiGLU per expert that received tokens (one host sync)."""
        ys = torch.empty_like(xs)
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n:
                rows = xs[start:start + n]
                gate, up = F.linear(rows, self.gate_up_proj[e]).chunk(2, dim=-1)
                ys[start:start + n] = F.linear(self.act(gate) * up, self.down_proj[e])
                start += n
        return ys

    def _grouped(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The same sums as two grouped products over contiguous runs of one expert's rows."""
        offs = counts.cumsum(0).to(torch.int32)                                    # (E,)
        h = torch._grouped_mm(xs, self.gate_up_proj.transpose(1, 2), offs=offs)   # (N k, 2I)
        gate, up = h.chunk(2, dim=-1)
        return torch._grouped_mm(self.act(gate) * up, self.down_proj.transpose(1, 2), offs=offs)


class SparseMoE(nn.Module):
    """Routed experts plus the shared experts (if any), over x (..., C)."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.gate = Router(cfg)
        self.experts = Experts(cfg)
        shared = cfg.shared_expert_intermediate_size
        self.shared_experts = SwiGLU(cfg.hidden_size, shared) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])                                          # (N, C)
        idx, weights = self.gate(flat)
        out = self.experts(flat, idx, weights)
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view_as(x)
