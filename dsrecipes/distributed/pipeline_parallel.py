"""Pipeline parallelism for the GPT with torch.distributed.pipelining (DeepSpeed's PipelineEngine idea).

    pipe = PipelineParallel(gpt, pp_group, schedule="1f1b", n_microbatches=gas, partition="uniform")
    pipe.stage_modules              # this rank's GPTStage(s); the optimizer is built over them
    loss = pipe.train_step(input_ids [gas*micro, T], labels)   # all micro-batches, forward + backward

* Stages: the blocks are cut into pp (x 2 for interleaved 1F1B) contiguous stages, `uniform`ly by
  count or balanced by `parameters` (embeddings counted on the first stage, the LM head on the
  last). A GPTStage keeps its GPT's module names (tok_emb, blocks.<i>, final_norm, lm_head), so its
  state dict keys are the single-process model's and DCP checkpoints move between layouts.
* Schedules: gpipe (ScheduleGPipe), 1f1b (Schedule1F1B, DeepSpeed's TrainSchedule),
  interleaved_1f1b (ScheduleInterleaved1F1B, two stages per rank). Micro-batches = gradient
  accumulation steps, as in DeepSpeed; each micro-batch's loss is divided by their number before its
  backward (the Engine's engine.backward does the same), so the gradients are their average.
* Tied embeddings: the first stage's tok_emb and the last stage's lm_head hold copies of the one
  tied weight; after the backward their gradients are summed between the two ranks
  (DeepSpeed's ReduceTiedGrads), so both copies stay equal; the last stage's copy is left out of
  the gradient norm so it counts once.
* Data parallelism is the data-parallel strategy's (dsrecipes.distributed.data_parallel): each
  stage's gradients are averaged over its data-parallel peers at the accumulation boundary.
* The loss (mean over micro-batches) is computed on the last stage and broadcast to the group.
* fp16 loss scaling: `train_step(..., loss_scale=s)` multiplies each micro-batch's loss by s as well
  (loss x s / micro-batches, DeepSpeed's order: accumulated 16-bit gradients overflow exactly when the
  single process's would); the returned loss is unscaled.
* Ulysses sequence parallelism (parallel.sp): every stage runs this rank's chunk of each sequence;
  `position_offset` (train_step / eval_loss) places it for the position embedding and the rotary
  tables, and the last stage reweights its chunk-mean loss by its share of counted labels
  (dsrecipes.distributed.sequence_parallel.sequence_parallel_loss), so the mean over the sp ranks is
  the full-sequence loss.
"""

from __future__ import annotations

import collections
import contextlib
import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from dsrecipes.distributed.config import PP_PARTITIONS, PP_SCHEDULES  # noqa: F401 (exported here too)
from dsrecipes.distributed.pipeline_loss_terms import StageLossTerms
from dsrecipes.distributed.sequence_parallel import SequenceParallel
from dsrecipes.distributed.tensor_parallel import vocab_parallel_cross_entropy
from dsrecipes.models.gpt import GPT
from dsrecipes.models.moe import routing_stats_paused
from dsrecipes.utils.dtensors import local as local_piece

MAX_SCHEDULES = 3  # schedules (one per batch shape) kept alive: the current training and evaluation shapes, one spare


def stages_per_rank(schedule: str) -> int:
    return 2 if schedule == "interleaved_1f1b" else 1


def partition_blocks(gpt: GPT, num_stages: int, method: str) -> list[range]:
    """Contiguous block ranges, one per stage: equal counts, or balanced trainable-parameter counts."""
    n = len(gpt.blocks)
    if num_stages > n:
        raise ValueError(f"{num_stages} pipeline stages need at least as many blocks; model.n_layer={n}")
    if method == "uniform":
        bounds = [round(i * n / num_stages) for i in range(num_stages + 1)]
        return [range(bounds[i], bounds[i + 1]) for i in range(num_stages)]
    sizes = [sum(p.numel() for p in b.parameters()) for b in gpt.blocks]
    sizes[0] += sum(p.numel() for p in gpt.tok_emb.parameters()) + (gpt.pos_emb.weight.numel() if gpt.pos_emb is not None else 0)
    sizes[-1] += gpt.lm_head.weight.numel() if gpt.lm_head.weight is not gpt.tok_emb.weight else 0
    ranges, start, remaining = [], 0, sum(sizes)
    for stage in range(num_stages):
        left = num_stages - stage
        target, end, acc = remaining / left, start, 0
        while end < n - (left - 1) and (end == start or acc + sizes[end] / 2 <= target):
            acc += sizes[end]
            end += 1
        ranges.append(range(start, end))
        remaining -= acc
        start = end
    return ranges


def local_stage_ids(pp_rank: int, pp_size: int, schedule: str) -> list[int]:
    """The stages pipeline rank `pp_rank` runs: r, r + pp, ... (torch's looped layout for interleaved schedules)."""
    return [pp_rank + k * pp_size for k in range(stages_per_rank(schedule))]


def describe_pipeline(schedule: str, micro_batches: int, partition: str) -> str:
    """The layout line's pipeline part: schedule, micro-batches per step, partition."""
    return f"pipeline: {schedule}, {micro_batches} micro-batches per step, partition by {partition}"


def build_gpt_for_rank(model_cfg, moe, dims, parallel, device: torch.device) -> GPT:
    """The GPT this rank trains from scratch: the whole model on `device`, or under pipeline parallelism
    (dims.pp > 1) only this rank's stages, initialised as the single process's (materialize_pipeline_rank).

    model_cfg / moe / parallel: the recipe's model, moe and parallel groups; dims: the run's ParallelDims."""
    if dims.pp == 1:
        with torch.device(device):
            return GPT(model_cfg, moe=moe)
    with torch.device("meta"):
        gpt = GPT(model_cfg, moe=moe)
    materialize_pipeline_rank(gpt, dims.get_mesh("pp").get_local_rank(), dims.pp, parallel.pp_schedule,
                              parallel.pp_partition, device)
    return gpt


@torch.no_grad()
def materialize_pipeline_rank(gpt: GPT, pp_rank: int, pp_size: int, schedule: str, partition: str,
                              device: torch.device) -> list[int]:
    """Allocate on `device` only what pipeline rank `pp_rank` runs of a GPT built on the meta device, and
    initialise it with exactly the single process's values; returns this rank's block indices.

    The other ranks' blocks (and embeddings / LM head) stay on the meta device, so start-up memory falls
    with pp. Initialisation replays the whole model's random draws in the single process's order
    (GPT.init_weights: a parameter held elsewhere draws into a dropped scratch tensor), so the random
    stream is where one process leaves it and every local parameter equals that process's. A tied
    embedding held by the first stage (tok_emb) and the last (lm_head) is one parameter again after.
    """
    num_stages = pp_size * stages_per_rank(schedule)
    ranges = partition_blocks(gpt, num_stages, partition)
    stage_ids = local_stage_ids(pp_rank, pp_size, schedule)
    blocks = sorted(i for s in stage_ids for i in ranges[s])
    modules = [gpt.blocks[i] for i in blocks]
    first, last = 0 in stage_ids, num_stages - 1 in stage_ids
    if first:
        modules += [gpt.tok_emb] + ([gpt.pos_emb] if gpt.pos_emb is not None else [])
    if last:
        modules += [gpt.final_norm, gpt.lm_head]
    tied = gpt.lm_head.weight is gpt.tok_emb.weight
    for module in modules:
        module.to_empty(device=device)
    if tied and first:
        gpt.lm_head.weight = gpt.tok_emb.weight
    elif tied and last:
        gpt.tok_emb.weight = gpt.lm_head.weight
    for name, buffer in list(gpt.named_buffers(recurse=False)):  # rotary tables: every stage uses them
        setattr(gpt, name, torch.empty_like(buffer, device=device))
    gpt.init_weights()
    return blocks


class GPTStage(nn.Module):
    """The part of a GPT one pipeline stage runs: [embeddings] -> blocks[i..j) -> [final norm, LM head].

    position_offset: the position of the stage input's first token (a sequence-parallel rank's chunk
    start, set by PipelineParallel for each step; 0 otherwise)."""

    position_offset = 0

    loss_terms: StageLossTerms | None = None  # extra loss terms arising in this stage (PipelineParallel.set_loss_terms)

    def __init__(self, gpt: GPT, blocks: range, first: bool, last: bool):
        super().__init__()
        self.first, self.last, self.style = first, last, gpt.cfg.style
        self.seq_shards = gpt.activation_seq_shards  # tensor-parallel sequence shards of the stage input
        if first:
            self.tok_emb, self.pos_emb, self.emb_dropout = gpt.tok_emb, gpt.pos_emb, gpt.emb_dropout
        self.blocks = nn.ModuleDict({str(i): gpt.blocks[i] for i in blocks})
        if last:
            self.final_norm, self.lm_head = gpt.final_norm, gpt.lm_head
        if self.style == "llama":
            self.register_buffer("rope_cos", gpt.rope_cos, persistent=False)
            self.register_buffer("rope_sin", gpt.rope_sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq_len = x.shape[1] if self.first else x.shape[1] * self.seq_shards
        start, end = self.position_offset, self.position_offset + seq_len
        if self.first:
            ids = x
            x = self.tok_emb(ids)
            if self.pos_emb is not None:
                x = x + self.pos_emb(torch.arange(start, end, device=ids.device))
            x = self.emb_dropout(x)
        rope = None
        if self.style == "llama":
            rope = (self.rope_cos[start:end], self.rope_sin[start:end])
        for block in self.blocks.values():
            x = block(x, rope)
        if self.last:
            x = self.lm_head(self.final_norm(x))
        if self.loss_terms is not None:  # e.g. this stage's MoE auxiliary losses, whose gradient is added here
            x = self.loss_terms.apply(self, x)
        return x


def lm_loss(logits: torch.Tensor, labels: torch.Tensor, sequence_parallel: SequenceParallel | None = None) -> torch.Tensor:
    """Mean cross-entropy of the last stage's logits; vocab-sharded (tensor-parallel) logits use the
    vocab-parallel loss (the Engine runs the schedule under loss_parallel). Under sequence parallelism
    the chunk's mean is reweighted by its share of the counted labels (exact with -100 labels)."""
    if isinstance(logits, DTensor):
        loss = vocab_parallel_cross_entropy(logits.flatten(0, 1), labels.flatten())
    else:
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
    return sequence_parallel.loss(loss, labels) if sequence_parallel is not None else loss


def _metadata_pass_stage_class(base: type) -> type:
    """A PipelineStage that enters `metadata_pass_contexts` while its schedule infers shapes.

    torch.distributed.pipelining infers each stage's input/output shapes (on the first step, and again after
    every eval/train switch) by running the stage forward once, outside the training passes. torch forks its
    own RNG for it, but stateful samplers of our own (random-LTD's per-layer draw counts) would count that
    pass as a micro-batch; their `paused()` contexts, registered by whoever owns them, keep it out.
    """

    class _MetadataPassStage(base):
        def __init__(self, *args, metadata_pass_contexts: list, **kwargs):
            super().__init__(*args, **kwargs)
            self._metadata_pass_contexts = metadata_pass_contexts

        def _prepare_forward_infra(self, *args, **kwargs):
            with self._metadata_pass():
                return super()._prepare_forward_infra(*args, **kwargs)

        def _prepare_backward_infra(self, *args, **kwargs):
            with self._metadata_pass():
                return super()._prepare_backward_infra(*args, **kwargs)

        @contextlib.contextmanager
        def _metadata_pass(self):
            with contextlib.ExitStack() as stack:
                for make_context in self._metadata_pass_contexts:
                    stack.enter_context(make_context())
                yield

    return _MetadataPassStage


class PipelineParallel:
    def __init__(self, gpt: GPT, group, schedule: str, n_microbatches: int, partition: str, device: torch.device,
                 all_pipelines: list[list[int]] | None = None, sequence_parallel: SequenceParallel | None = None):
        """group: this rank's pipeline group; all_pipelines: the global ranks of every pipeline group
        (every rank must create the tied-weight groups of all of them, in the same order);
        sequence_parallel: the Ulysses groups already installed on `gpt` (its loss reweighting is used)."""
        if schedule not in PP_SCHEDULES:
            raise ValueError(f"parallel.pp_schedule={schedule!r} is not valid; choose one of: {', '.join(PP_SCHEDULES)}")
        self.group, self.device = group, device
        self.schedule_name, self.partition = schedule, partition
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        per_rank = stages_per_rank(schedule)
        num_stages = self.size * per_rank
        ranges = partition_blocks(gpt, num_stages, partition)
        self.stage_ids = local_stage_ids(self.rank, self.size, schedule)
        self.first_rank, self.last_rank = 0, (num_stages - 1) % self.size
        self.stage_modules = [GPTStage(gpt, ranges[s], s == 0, s == num_stages - 1) for s in self.stage_ids]
        self.block_ranges = [ranges[s] for s in self.stage_ids]
        # imported here: torch.distributed.pipelining pulls in torch._dynamo (~0.7 s at every start-up otherwise)
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

        # contexts entered while the schedule infers the stages' shapes by running them (see _MetadataPassStage)
        self.metadata_pass_contexts: list = [routing_stats_paused]
        self.loss_terms: StageLossTerms | None = None
        self.has_first = 0 in self.stage_ids
        self.has_last = num_stages - 1 in self.stage_ids
        stage_cls = _metadata_pass_stage_class(PipelineStage)
        schedule_cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}[schedule]
        self._lm_loss = functools.partial(lm_loss, sequence_parallel=sequence_parallel) if sequence_parallel else lm_loss
        self.loss_scale = 1.0  # the fp16 loss scale of the step being run (train_step sets it)
        self.n_microbatches = n_microbatches
        # the loss function averages over micro-batches itself (see _scaled_loss): no gradient rescaling after

        def make_schedule():
            stages = [stage_cls(m, s, num_stages, device, group=group, metadata_pass_contexts=self.metadata_pass_contexts)
                      for m, s in zip(self.stage_modules, self.stage_ids)]
            return schedule_cls(stages if per_rank > 1 else stages[0], n_microbatches=n_microbatches,
                                loss_fn=self._scaled_loss, scale_grads=False)

        self._make_schedule = make_schedule
        # one schedule per batch shape: stages infer their activation shapes once and keep receive buffers of
        # that shape, so a sequence-length curriculum (or seqlen pack mode's rows) needs a schedule per shape;
        # the most recent few are kept (a curriculum only grows; evaluation runs at the full length)
        self._schedules: collections.OrderedDict[tuple, object] = collections.OrderedDict()
        self.tied = gpt.cfg.tie_embeddings and self.size > 1
        self.tied_group = None
        if self.tied and {self.first_rank, self.last_rank} == set(range(self.size)):
            self.tied_group = group  # two stages: the first and last ranks are the whole pipeline
        elif self.tied:  # groups of each pipeline's first and last ranks, created by every rank alike
            me = dist.get_rank()
            for ranks in all_pipelines or [dist.get_process_group_ranks(group)]:
                tied = dist.new_group(sorted({ranks[self.first_rank], ranks[self.last_rank]}))
                if me in (ranks[self.first_rank], ranks[self.last_rank]):
                    self.tied_group = tied

    def describe(self) -> str:
        """The run's layout line's pipeline part (describe_pipeline)."""
        return describe_pipeline(self.schedule_name, self.n_microbatches, self.partition)

    def set_loss_terms(self, terms: list) -> StageLossTerms:
        """Evaluate stage-local loss terms (MoE auxiliary losses) in every stage of this rank; their gradients
        join the backward where they arise (dsrecipes.distributed.pipeline_loss_terms)."""
        if self.loss_terms is None:
            self.loss_terms = StageLossTerms(terms)
            self.metadata_pass_contexts.append(self.loss_terms.paused)
            for module in self.stage_modules:
                module.loss_terms = self.loss_terms
        return self.loss_terms

    def local_module(self, gpt: GPT) -> GPTStage:
        """One module holding every parameter of this rank's stages under the model's names: what the
        optimizer steps and checkpoints save (the schedule runs the stage modules themselves)."""
        blocks = sorted(i for r in self.block_ranges for i in r)
        return GPTStage(gpt, blocks, self.has_first, self.has_last)

    def tied_params(self) -> list[nn.Parameter]:
        """The tied embedding copies this rank holds (first: tok_emb.weight, last: lm_head.weight)."""
        out = []
        for module in self.stage_modules:
            if module.first and self.tied:
                out.append(module.tok_emb.weight)
            if module.last and self.tied:
                out.append(module.lm_head.weight)
        return out

    def norm_duplicates(self) -> set[int]:
        """ids of parameters left out of the gradient norm: the last stage's copy of the tied weight."""
        out = set()
        for module in self.stage_modules:
            if module.last and self.tied:
                out.add(id(module.lm_head.weight))
        return out

    @torch.no_grad()
    def reduce_tied_grads(self) -> None:
        for param in self.tied_params():
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            grad = param.grad
            if isinstance(grad, DTensor) and tuple(grad.placements) != tuple(param.placements):
                param.grad = grad = grad.redistribute(param.device_mesh, param.placements)  # as sharded as the weight
            dist.all_reduce(local_piece(grad), group=self.tied_group)  # the same tp shard on both ranks

    def _scaled_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The micro-batch's loss x loss scale / micro-batches: what its backward starts from."""
        return self._lm_loss(logits, labels) * (self.loss_scale / self.n_microbatches)

    def schedule_for(self, shape: tuple) -> object:
        """The schedule for batches of `shape` (every rank of the pipeline sees the step's batch, so all pick alike)."""
        schedule = self._schedules.get(shape)
        if schedule is None:
            schedule = self._schedules[shape] = self._make_schedule()
            while len(self._schedules) > MAX_SCHEDULES:
                self._schedules.popitem(last=False)
        self._schedules.move_to_end(shape)
        return schedule

    def _place(self, position_offset: int) -> None:
        for module in self.stage_modules:
            module.position_offset = int(position_offset)

    def train_step(self, input_ids: torch.Tensor, labels: torch.Tensor, position_offset: int = 0,
                   loss_scale: float = 1.0) -> torch.Tensor:
        """Forward + backward of all micro-batches; returns the mean loss on every rank of the group.
        position_offset: the position of input_ids' first token (a sequence-parallel chunk's start);
        loss_scale: each micro-batch's loss is multiplied by it (fp16 loss scaling), the returned loss is not."""
        self.loss_scale = float(loss_scale)
        if self.loss_terms is not None:  # the stages' extra terms start their backward from the same factor
            self.loss_terms.loss_scale = self.loss_scale / self.n_microbatches
        self._place(position_offset)
        losses: list[torch.Tensor] = []
        kwargs = {}
        if self.has_last:
            kwargs = {"target": labels, "losses": losses}
        schedule = self.schedule_for(tuple(input_ids.shape))
        if self.has_first:
            schedule.step(input_ids, **kwargs)
        else:
            schedule.step(**kwargs)
        self.reduce_tied_grads()
        loss = self._broadcast_loss(losses) * (self.n_microbatches / self.loss_scale)
        self.loss_scale = 1.0
        return loss

    @torch.no_grad()
    def eval_loss(self, input_ids: torch.Tensor, labels: torch.Tensor, position_offset: int = 0) -> float:
        self._place(position_offset)
        losses: list[torch.Tensor] = []
        kwargs = {"target": labels, "losses": losses} if self.has_last else {}
        schedule = self.schedule_for(tuple(input_ids.shape))
        if self.has_first:
            schedule.eval(input_ids, **kwargs)
        else:
            schedule.eval(**kwargs)
        return float(self._broadcast_loss(losses)) * self.n_microbatches

    def _broadcast_loss(self, losses: list[torch.Tensor]) -> torch.Tensor:
        value = (torch.stack([local_piece(loss.detach()).float() for loss in losses]).mean() if losses
                 else torch.zeros((), device=self.device))
        value = value.reshape(1).to(self.device)
        src = dist.get_process_group_ranks(self.group)[self.last_rank]
        dist.broadcast(value, src=src, group=self.group)
        return value[0]

    def full_state_dict(self, local_state: dict | None = None, gather_local=None) -> dict:
        """Every stage's tensors (CPU) merged into the single-process model's state dict, on every rank.

        local_state: this rank's part under the model's names, when the stage modules do not hold the
        full-precision values (the fp32 master weights of a bf16/fp16 pipeline); default: the stage modules'.
        gather_local(state) -> state: completes this rank's tensors within its stage first (expert-parallel
        experts gathered over their groups), a collective of the stage's ranks.
        """
        parts = [local_state] if local_state is not None else [m.state_dict() for m in self.stage_modules]
        local = {}
        for part in parts:
            for k, v in part.items():  # tensor-parallel shards gathered (a tp collective)
                local[k] = (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
        if gather_local is not None:
            local = gather_local(local)
        gathered = [None] * self.size
        dist.all_gather_object(gathered, local, group=self.group)
        merged = {}
        for part in gathered:
            merged.update(part)
        if self.tied:  # one tensor under both names, as in the single-process model (an export stores it once)
            merged["lm_head.weight"] = merged.get("tok_emb.weight", merged.get("lm_head.weight"))
            merged["tok_emb.weight"] = merged["lm_head.weight"]
        return merged
