"""The runtime helpers of the generated PyTorch code: the `Module` base class of its classes, and the functions its
statements call (`linear`, `linears`, `attended_keys`, `cache_rows`, `one_row_attention`).

A generated module imports the ones it uses (`from linnet.compiler.torch.prelude import Module, linear`): the backend
runs it so (`module.LinnetModule`), and the language server shows it so. A standalone file (`linnet torch FILE -o
model.py`, which imports only torch) carries their definitions instead, which the code generator reads from this
file's text (`codegen` imports no torch): `Module` before the model's classes, the functions after them. So each
definition here stands alone: it reads torch, `F`, `nn` and this file's names only. The timings behind the choices
below are in docs/backends.md ("The generated module's helpers").
"""

import torch
import torch.nn.functional as F
from torch import nn


class Module(nn.Module):
    """A module of the checkpoint's tree. PARAMS and STATE map dotted paths to (shape, dtype):
    parameters have no storage (the meta device) until a checkpoint is loaded, state is zeroed
    buffers on `device`. CHILDREN maps a name to a class, or to (class, count) for a list."""

    PARAMS: dict = {}
    STATE: dict = {}
    CHILDREN: dict = {}

    def __init__(self, device="cpu"):
        super().__init__()
        for name, child in self.CHILDREN.items():
            if isinstance(child, tuple):
                self.add_module(name, nn.ModuleList(child[0](device) for _ in range(child[1])))
            else:
                self.add_module(name, child(device))
        for path, (shape, dtype) in self.PARAMS.items():
            owner, name = self.owner(path)
            empty = torch.empty(shape, dtype=dtype, device="meta")
            owner.register_parameter(name, nn.Parameter(empty, requires_grad=False))
        for path, (shape, dtype) in self.STATE.items():
            owner, name = self.owner(path)
            owner.register_buffer(name, torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def owner(self, path):
        """The submodule holding `path` (made on the way: lists as ModuleLists) and its name there."""
        *parents, name = path.split(".")
        module = self
        for i, part in enumerate(parents):
            if part not in module._modules:
                child = nn.ModuleList() if (parents + [name])[i + 1].isdigit() else Module()
                if isinstance(module, nn.ModuleList):
                    while len(module) < int(part):  # elements without tensors before it (a Sequential's Flatten)
                        module.append(Module())
                    module.append(child)
                else:
                    module.add_module(part, child)
            module = module._modules[part]
        return module, name

    # A module's tensors and submodules are also plain attributes, so that methods read them as
    # fast as attributes (nn.Module finds them through a Python __getattr__, which a decode step
    # calls for every tensor it reads). Every way nn.Module stores or replaces one passes through these.
    def register_parameter(self, name, param):
        super().register_parameter(name, param)
        self._mirror()

    def register_buffer(self, name, tensor, persistent=True):
        super().register_buffer(name, tensor, persistent)
        self._mirror()

    def add_module(self, name, module):
        super().add_module(name, module)
        self._mirror()

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        self._mirror()

    def __delattr__(self, name):
        super().__delattr__(name)
        self.__dict__.pop(name, None)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._mirror()
        return out

    def _mirror(self):
        if "_modules" in self.__dict__:
            for table in (self._parameters, self._buffers, self._modules):
                self.__dict__.update(table)

    def __getitem__(self, i):
        """Item `i` of a list whose items are modules of different classes (`layers[0]`)."""
        return self._modules[str(i)]


# Attention over a KV cache (`codegen._grouped_attention`, `sdpa` with `trim_keys`); the interpreter calls it too.
def attended_keys(mask, keys):
    """How attention reads a KV cache of `keys` positions under `mask` (bool[B, S, keys], True: attended): SDPA
    runs over the first `n` keys with `attn_mask` and `is_causal`, returned as (n, attn_mask, is_causal). The keys
    after the last one any query attends weigh exact zeros, so `n` ends there, and where the mask says nothing more
    it is dropped: no mask where every query attends every kept key (a decode step of one request), `is_causal`
    where it is the causal triangle (a prompt from position 0), the calls transformers' SDPA attention makes.
    That needs a host synchronisation: done eagerly only (torch.compile traces the whole masked cache), for decode
    on the CPU only (CUDA graphs capture decode steps), and once per mask: every layer passes the same tensor."""
    S = mask.shape[1]
    if torch.compiler.is_compiling() or (S == 1 and not mask.is_cpu):
        return keys, mask.unsqueeze(1), False
    plan = mask.__dict__.get("attended_keys")
    if plan is None:
        plan = keys, mask.unsqueeze(1), False
        attended = mask.flatten(0, 1).any(0).nonzero()
        if attended.numel():  # else no query attends any key (padding): the whole cache, masked, as before
            n = int(attended[-1]) + 1
            kept = mask[:, :, :n]
            if bool(kept.all()):
                plan = n, None, False
            elif n == S and torch.equal(kept, kept.new_ones(S, S).tril().expand_as(kept)):
                plan = n, None, True
            else:
                plan = n, kept.unsqueeze(1), False
        mask.attended_keys = plan
    return plan


# Attention's keys and values of some cache rows (`codegen._take`, read where `attended_keys` has trimmed them).
def cache_rows(cache, rows, keys):
    """`cache[rows][:, :, :keys]`: the first `keys` positions of the cache rows `rows` (cache [R, H, T, D], rows
    i64[B] -> [B, H, keys, D]), without copying the whole cache of each row first, which a serving step of B rows
    did at every layer whatever the rows held (B * T * H * D values, twice). Consecutive rows (a serving engine's
    usual batch, checked once per `rows` tensor, eagerly on the CPU: every layer passes the same one) are a view
    with the strides of that slice; other rows gather only those positions."""
    if rows.is_cpu and not torch.compiler.is_compiling():
        first = rows.__dict__.get("first_of_run")
        if first is None:  # `tolist` reads the CPU tensor's memory: no op, no device synchronisation
            ids = rows.tolist()
            first = ids[0] if ids and ids == list(range(ids[0], ids[0] + len(ids))) else -1
            rows.first_of_run = first
        if first >= 0:
            return cache[first : first + rows.numel(), :, :keys]
    return cache[rows, :, :keys]


# Every linear layer of a generated module calls `linear` (the interpreter and `codegen.graph_function` call
# F.linear): on the CPU, up to 16 rows of f32 as blocks run in parallel, one bf16 row as mv.
def linear(x, weight):
    """`F.linear(x, weight)`: x [.., K] @ weight [N, K]^T -> [.., N], computed another way where that is faster on the
    CPU, eagerly:
    - f32, up to 16 rows: `F.linear` there is MKL's sgemv or a small sgemm, which run on one thread whatever the
      thread count, so the rows run as `torch.get_num_threads()` blocks in one `torch.bmm`, which ATen runs in
      parallel:
      - a weight stored transposed (strides (1, N): the wide weights of a `fast` module,
        `fusion.hold_wide_weights_transposed`) as blocks of K: each block's rows of the [K, N] matrix in memory times
        its slice of x, the partial products summed;
      - any other contiguous weight as blocks of its N rows (`_blocks_of_n`), each output the same dot product.
    - bf16, one row: `torch.mv`, ATen's bf16 GEMV, where `F.linear` calls oneDNN's matmul.
    Blocks of N rows and torch.mv run only where they gave F.linear's bits on probe values (`_same_bits`).
    Anything else (torch.compile's trace or a torch.func transform, gradients, another dtype, device or layout, x
    not contiguous, more rows, blocks that do not divide the weight, a weight subclass such as a quantized or
    distributed one, a torch function mode) is F.linear."""
    if (
        torch.compiler.is_compiling()
        or x.dtype != weight.dtype
        or x.dtype not in (torch.float32, torch.bfloat16)
        or not x.is_cpu
        or weight.dim() != 2
        or x.dim() == 0
        or x.shape[-1] != weight.shape[1]
        or not 0 < x.numel() <= 16 * weight.shape[1]
        or type(x) is not torch.Tensor
        or type(weight) not in (torch.Tensor, nn.Parameter)
        or x.layout != torch.strided
        or weight.layout != torch.strided
        or not x.is_contiguous()
        or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        or torch._C._functorch.is_functorch_wrapped_tensor(x)
        or torch._C._is_torch_function_mode_enabled()
    ):
        return F.linear(x, weight)
    n, k = weight.shape
    rows = x.numel() // k
    if x.dtype == torch.bfloat16:
        return _one_row_mv(x, weight) if rows == 1 and _same_bits(_one_row_mv, x, weight) else F.linear(x, weight)
    blocks = torch.get_num_threads()
    if blocks < 2:
        return F.linear(x, weight)
    if weight.stride() == (1, n) and n > 1 and k % blocks == 0:  # [K, N] in memory: blocks of K, summed
        parts = x.reshape(rows, blocks, k // blocks).transpose(0, 1)  # [blocks, rows, K / blocks]
        return torch.bmm(parts, weight.t().view(blocks, k // blocks, n)).sum(0).view(*x.shape[:-1], n)
    if not weight.is_contiguous() or n % blocks or not _same_bits(_blocks_of_n, x, weight):
        return F.linear(x, weight)
    return _blocks_of_n(x, weight)


def _blocks_of_n(x, weight):
    """`F.linear(x, weight)` as `torch.get_num_threads()` blocks of weight's N rows in one `torch.bmm`."""
    n, k = weight.shape
    rows, blocks = x.numel() // k, torch.get_num_threads()
    y = torch.bmm(x.reshape(1, rows, k).expand(blocks, rows, k), weight.view(blocks, n // blocks, k).transpose(1, 2))
    return y.transpose(0, 1).reshape(*x.shape[:-1], n)  # [blocks, rows, N / blocks] -> [rows, N]


def _one_row_mv(x, weight):
    """`F.linear(x, weight)` of one row x [.., K] as `torch.mv`."""
    return torch.mv(weight, x.reshape(-1)).view(*x.shape[:-1], weight.shape[0])


_SAME_BITS = {}  # (way, dtype, rows, N, K, threads, weight strides, addresses mod 64) -> F.linear's bits?
_PROBED_OUTPUTS = 4096  # outputs compared before a way counts as F.linear's bits
_CANCELLING = 3  # the last columns of a probe, chosen so that each output's exact dot product cancels


def _same_bits(way, x, weight):
    """Whether `way(x, weight)` gave `F.linear`'s bits for contiguous x [.., K] and weight [N, K] of these shapes,
    dtype, strides, alignment and thread count, on probe values that tell summation orders apart. Two kernels that
    sum each dot product in the same order give the same bits for any values; two that sum in other orders round
    differently, but on plain random values the rounding errors rarely reach the output's last bit (bf16 `F.linear`
    and `torch.mv` through [576, 1536] differ on ~6e-5 of outputs on an AVX-512 EPYC: 4,096 uniform outputs missed
    it). So each probe's dot products cancel (`_cancelling_probe`): what is left is the rounding errors themselves,
    and other orders give other outputs (there, 92 % of them). The first call of each kind compares
    `_PROBED_OUTPUTS` outputs or more (probe rows and a probe weight laid out as the real one, at most 8 draws),
    once a process."""
    n, k = weight.shape
    rows = x.numel() // k
    key = (way.__name__, x.dtype, rows, n, k, torch.get_num_threads(), weight.stride(), x.data_ptr() % 64,
           weight.data_ptr() % 64)  # fmt: skip
    if key not in _SAME_BITS:
        with torch.no_grad():
            generator = torch.Generator().manual_seed(0)
            w_span = weight.stride(0) * (n - 1) + weight.stride(1) * (k - 1) + 1
            w_shift, x_shift = key[-1] // weight.element_size(), key[-2] // x.element_size()
            w_probe = torch.empty(w_span + 64, dtype=x.dtype)[w_shift:].as_strided((n, k), weight.stride())
            x_probe = torch.empty(rows * k + 64, dtype=x.dtype)[x_shift:][: rows * k].view(rows, k)
            same = True
            for _ in range(min(8, -(-_PROBED_OUTPUTS // (rows * n)))):  # the check stops at the first difference
                _cancelling_probe(x_probe, w_probe, generator)
                same = torch.equal(way(x_probe, w_probe), F.linear(x_probe, w_probe))
                if not same:
                    break
            _SAME_BITS[key] = same
    return _SAME_BITS[key]


_PROBE_ROWS = 64  # the distinct rows of a probe weight, repeated down its N rows


def _cancelling_probe(x, weight, generator):
    """Fill x [R, K] and weight [N, K] in place with values whose dot products cancel: random values over 2^-8 ..
    2^8 in magnitude (so the running sums hold more bits than the dtype), then the last `_CANCELLING` columns set,
    against x's first row (the others are it scaled by powers of two, exactly), to minus what the columns before
    them sum to, exactly (in f64), as far as the dtype can hold it: each exact result is a few units in the dtype's
    last place of its largest terms, and a kernel's output is mostly its own rounding errors. The weight's rows are
    `_PROBE_ROWS` distinct rows repeated (each output's order is checked on every row; the draw stays cheap for a
    [49152, 576] head)."""
    rows, k = x.shape
    distinct = min(_PROBE_ROWS, weight.shape[0])
    spread = torch.randint(-8, 9, (1 + distinct, k), dtype=torch.int8, generator=generator).to(x.dtype)
    values = torch.empty(spread.shape, dtype=x.dtype).uniform_(-1, 1, generator=generator) * torch.pow(2, spread)
    x[0], patterns = values[0], values[1:]
    if k > _CANCELLING:
        x[0, k - _CANCELLING :] = 1
        total = patterns[:, : k - _CANCELLING].double() @ x[0, : k - _CANCELLING].double()
        for column in range(k - _CANCELLING, k):
            patterns[:, column] = (-total).to(x.dtype)
            total += patterns[:, column].double()
    for start in range(0, weight.shape[0], distinct):
        block = weight[start : start + distinct]
        block.copy_(patterns[: block.shape[0]])
    x[1:] = x[0] * torch.pow(2.0, torch.arange(1, rows, dtype=torch.float64) % 5 - 2).to(x.dtype)[:, None]


# Linear layers sharing their input, one `linear` over their weights joined where they lie in one buffer (`fusion.
# concat_linear_weights`; an f32 `fast` module and an inductor module on the CPU, `codegen.module_passes`).
def linears(x, weights, joined_under_compile=False):
    """`tuple(F.linear(x, w) for w in weights)`: x [.., K] @ each weight [N_i, K]^T -> [.., N_i] each. Weights that
    lie adjacently in one buffer, with the same strides (an f32 `fast` module and an inductor module on the CPU bind
    each group so: `LinnetModule.bind`), are read as that buffer's rows by one `linear` whose output is split (for a
    decode step's rows, faster than one `linear` a weight). Anything else (weights bound apart, a weight subclass such
    as a quantized or a distributed one, gradients to a weight, torch.compile's trace unless `joined_under_compile`)
    is one `linear` a weight.

    `joined_under_compile`: the module checks before each compiled call that each group still lies in one buffer
    (`LinnetModule.weight_groups_joined`, which reads the condition below: a trace cannot read addresses), so a trace
    reads each plain group as one buffer (`linears_joined_under_compile`, what an inductor module's code calls). Its
    eager calls (prefill) keep one `linear` a weight: joined, the outputs are strided views, and ATen's vectorised
    silu took another path for a strided row's tail (the last bit of `equivalent`'s f32 prefill moved where the
    intermediate size is 16 mod 32)."""
    first = weights[0]
    if torch.compiler.is_compiling():
        if (
            joined_under_compile
            and not (torch.is_grad_enabled() and any(w.requires_grad for w in weights))
            and all(
                type(w) in (torch.Tensor, nn.Parameter)
                and w.dim() == 2
                and w.stride() == first.stride()
                and w.dtype == first.dtype
                and w.shape[-1] == first.shape[-1]
                and w.device == first.device
                for w in weights
            )
        ):
            rows = [w.shape[0] for w in weights]
            return linear(x, first.as_strided((sum(rows), first.shape[-1]), first.stride())).split(rows, dim=-1)
        return tuple(linear(x, w) for w in weights)
    if not (joined_under_compile or torch.is_grad_enabled() and any(w.requires_grad for w in weights)):
        strides, width, dtype = first.stride(), first.shape[-1], first.dtype
        start, step, rows = first.data_ptr(), strides[0] * first.element_size(), 0
        for w in weights:
            if (
                type(w) not in (torch.Tensor, nn.Parameter)
                or w.stride() != strides
                or w.shape[-1] != width
                or w.dtype != dtype
                or w.data_ptr() != start + rows * step
            ):
                break
            rows += w.shape[0]
        else:  # rows of one buffer, if the first weight's storage holds them all
            last = first.storage_offset() + (rows - 1) * strides[0] + (width - 1) * strides[-1]
            if len(strides) == 2 and last < first.untyped_storage().nbytes() // first.element_size():
                joined = linear(x, first.as_strided((rows, width), strides))
                return joined.split([w.shape[0] for w in weights], dim=-1)
    return tuple(linear(x, w) for w in weights)


def linears_joined_under_compile(x, weights):
    """`linears` in an inductor module, which checks its groups before each compiled call (`joined_under_compile`):
    `LinnetModule` binds it as the module's `linears`."""
    return linears(x, weights, joined_under_compile=True)


# Under `fast` in bf16/f16, one query row on the CPU as the flash kernel's math with f32 matmuls (inductor's decode
# rewrite computes the same math, `inductor_passes._one_row_attention`, though its fused loops keep the exponentials
# in f32 where the kernel and this round them).
def one_row_attention(q, k, v, attn_mask, is_causal, scale):
    """`F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=is_causal, scale=scale, enable_gqa=True)`:
    q [B, H, S, D], k, v [B, Hkv, T, D], attn_mask bool [B, 1, S, T] (True: attended) or None -> [B, H, S, D].
    Under `fast`, a decode step's single query row (S = 1) of bf16/f16 on a CPU without dot instructions for that
    dtype (oneDNN says so: AVX2), eagerly, is the CPU flash kernel's math
    (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp: scores and softmax in f32, the exponentials rounded to q's
    dtype before the sum over the values, in f32, times 1 / their sum) with f32 matmuls: the kernel emulates its
    GEMMs there and blocks for many query rows (not measured where the dot instructions exist, so the kernel runs
    there). The kernel keeps
    a running max over blocks of keys, so the values differ from it within q's rounding; `equivalent` keeps the
    kernel (transformers' call, bit for bit). Anything else is the kernel's call."""
    B, H, S, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    if (
        torch.compiler.is_compiling()
        or S != 1
        or is_causal
        or q.dtype not in (torch.bfloat16, torch.float16)
        or not q.is_cpu
        or scale is None
        or (attn_mask is not None and tuple(attn_mask.shape) != (B, 1, 1, T))
        or (
            torch.ops.mkldnn._is_mkldnn_bf16_supported()
            if q.dtype == torch.bfloat16
            else torch.ops.mkldnn._is_mkldnn_fp16_supported()
        )
    ):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=True
        )
    scores = (q.reshape(B, Hkv, H // Hkv, D).float() @ k.float().transpose(-2, -1)) * scale  # [B, Hkv, G, T]
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask.reshape(B, 1, 1, T), float("-inf"))
    top = scores.amax(-1, keepdim=True)
    top = torch.where(top == float("-inf"), 0.0, top)  # a row masked everywhere gives zeros, as in the kernel
    weights = torch.exp(scores - top)
    total = weights.sum(-1, keepdim=True)
    total = torch.where(total == 0, 1.0, total)
    out = weights.to(q.dtype).float() @ v.float()  # [B, Hkv, G, D]
    return (out * (1.0 / total)).to(q.dtype).reshape(B, H, 1, D)
