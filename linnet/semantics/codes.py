"""The registry of diagnostic codes. docs/diagnostics.md is generated from it
(`make docs`, which runs `python -m linnet.docgen`; a test keeps them in sync).

Ranges: L0xx syntax, L1xx names and scopes (L12x imports), L2xx shapes, L3xx dtypes, L4xx configs and
presets, L5xx checkpoints and weights, L9xx style warnings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Code:
    code: str
    title: str
    severity: str
    explanation: str
    example: str
    fix: str


_ALL = [
    Code(
        "L000",
        "internal error",
        "error",
        "The checker could not finish this item: a bug in Linnet, or nesting deeper than it can "
        "follow (thousands of levels). The rest of the file is still checked.",
        "x + x + x + ... # twenty thousand terms",
        "Report the file; split very deep expressions.",
    ),
    # ----- L0xx syntax
    Code(
        "L001",
        "syntax error",
        "error",
        "The parser met a token it cannot accept here. Linnet recovers by skipping the statement "
        "or member around the error, so the rest of the file is still checked and several syntax "
        "errors are reported at once.",
        "let x = (a + ) * 2",
        "Complete or remove the expression; the note lists what was expected.",
    ),
    Code(
        "L002",
        "unexpected character",
        "error",
        "A character that no Linnet token starts with (or a string that runs to the end of the line).",
        "let x = a $ b",
        "Remove the character; strings are written in double quotes on one line.",
    ),
    Code(
        "L003",
        "unclosed delimiter",
        "error",
        "A `(`, `[` or `{` is never closed. Newlines inside `(` and `[` are not statement ends, so an "
        "unclosed parenthesis would swallow the following lines; the error points at the opener.",
        "let q = q_proj(x\nlet k = k_proj(x)",
        "Add the missing closing delimiter.",
    ),
    Code(
        "L004",
        "expected an item",
        "error",
        "Top-level text must be an item: `config`, `preset`, `module`, `model`, `fn` or an import "
        "(`from ... import ...`), starting in column 0. Indented lines belong to the item above them.",
        "let x = 1   # at the top level",
        "Move the code into a function or module.",
    ),
    # ----- L1xx names
    Code(
        "L101",
        "unknown name",
        "error",
        "The name is not defined in any enclosing scope: locals, function parameters, module members "
        "and parameters, the file's items and the standard library. Dim variables are introduced only "
        "by the parameter types of a function (and `max_batch`/`max_positions` in module state), so a "
        "misspelled dim is an error, not a new dim.",
        "fn f(x: [B, S]) -> [B, Q] { x }",
        "Use the suggested name, or bind it in a parameter type.",
    ),
    Code(
        "L102",
        "unknown field or member",
        "error",
        "The config has no such field, or the module no such member or method.",
        "c.hiden_size",
        "Use the suggested field name.",
    ),
    Code(
        "L103",
        "wrong number of arguments",
        "error",
        "A call passes more positional arguments than the callee has parameters, or misses a required one.",
        "rms_norm(x)",
        "Pass every required argument; the callee's signature is in the note.",
    ),
    Code(
        "L104",
        "unknown keyword argument",
        "error",
        "A keyword argument names no parameter of the callee.",
        "softmax(x, axis=-1)",
        "Use one of the parameter names in the note.",
    ),
    Code(
        "L105",
        "duplicate definition",
        "error",
        "Two definitions share a name in one scope (items of a file, members of a module, fields of a "
        "config, parameters of a function).",
        "config Llama { ... }\nconfig Llama { ... }",
        "Rename or remove one of them.",
    ),
    Code(
        "L106",
        "not callable",
        "error",
        "The value called is not a function, a module instance or an op.",
        "let y = x(2)",
        "Call a function or a submodule; index a tensor with `x[...]`.",
    ),
    Code(
        "L107",
        "wrong kind of value",
        "error",
        "A value of one kind is used where another is needed: a module where a tensor is expected, "
        "a tensor where a compile-time int is expected, and so on.",
        "reshape(x, q_proj)",
        "Pass a value of the kind named in the message.",
    ),
    Code(
        "L108",
        "member exists only under a condition",
        "error",
        "The member is declared inside `if cond { ... }` in its module, and this use is not under the "
        "same condition (or the condition is false under this config).",
        "x @ transpose(lm_head.weight)  # lm_head only if not c.tie_word_embeddings",
        "Wrap the use in the same compile-time `if`.",
    ),
    Code(
        "L109",
        "invalid assignment",
        "error",
        "Only locals declared with `let` and module `state` can be assigned.",
        "weight = weight * 2",
        "Declare a new local with `let`.",
    ),
    Code(
        "L110",
        "invalid model",
        "error",
        "A loadable file declares at most one root `model`, and its entry functions follow the entry "
        "contract: decoders (models with `state`) declare `forward(input_ids: i64[B, S]) -> "
        "[B, S, vocab]` and `step(input_ids: i64[B, S], positions: i64[B], rows: i64[B]) -> [B, vocab]`; "
        "encoders declare `forward(input_ids: i64[B, S], attention_mask: i64[B, S]) -> [B, S, hidden]`; "
        "encoder-decoders (decoders with an `encode` entry, Whisper) declare `forward(<encoder inputs>, "
        "decoder_input_ids: i64[B, S])`, `prefill_encoder(<encoder inputs>, rows: i64[B])` and `step`. "
        "A runtime reads an entry's dims from its inputs' shapes, so its parameters have a known rank (no "
        "`...`) and each dim variable is a whole dim of one of them (`S`, not only `2 * S`).",
        "model Llama(c: Llama) { fn forward(...) }  # no `entry`",
        "Mark entry functions with `entry` and give them the contract's signature.",
    ),
    Code(
        "L111",
        "not allowed here",
        "error",
        "A construct is used where the language does not allow it: a constructor call outside a member "
        "declaration, `state` outside a module, a function without a body value, `entry` outside a "
        "`model`, an attribute the language does not know.",
        "fn f(x: [N]) -> [N] { let l = Linear(4, 4) }",
        "Declare submodules as module members.",
    ),
    # ----- L12x imports
    Code(
        "L120",
        "imported file not found",
        "error",
        "An import names a file that cannot be read, or a standard-library module that does not exist. "
        'A file is found relative to the importing file (`from "llama.linnet" import ...` in '
        "`models/qwen2.linnet` reads `models/llama.linnet`); a standard-library module is named without "
        "quotes (`from std.nn import Linear`). The names it would import are not reported again where "
        "they are used.",
        'from "lama.linnet" import LlamaMLP',
        "Fix the path (relative to this file, with its `.linnet` suffix) or the module name.",
    ),
    Code(
        "L121",
        "imported name not found",
        "error",
        "The imported file does not define the name. A file exports the modules, functions and configs "
        "it defines; what it imports itself is not exported again, so import a name from the file that "
        "defines it.",
        'from "llama.linnet" import LlamaMPL',
        "Use the suggested name, or import it from the file that defines it.",
    ),
    Code(
        "L122",
        "import cycle",
        "error",
        "Files import each other in a cycle (or a file imports itself). Imports form a tree of files "
        "from the model down to the blocks it shares, so every file can be checked on its own; the "
        "message lists the files of the cycle.",
        'from "b.linnet" import B   # in a.linnet, while b.linnet imports from "a.linnet"',
        "Move what both files need into a third file that both import.",
    ),
    Code(
        "L123",
        "import name clash",
        "error",
        "An import binds a name that this file already defines, or that an earlier import binds. The "
        "file's own definition (or the first import) keeps the name.",
        'from "llama.linnet" import LlamaMLP\nmodule LlamaMLP(c: Llama) { ... }',
        'Import it under another name: `from "llama.linnet" import LlamaMLP as BaseMLP`.',
    ),
    Code(
        "L124",
        "not importable",
        "error",
        "Only modules (and models), functions and configs can be imported. A preset is a way to load the "
        "file that declares it, and a file is checked under its own presets, so presets stay in their file.",
        'from "llama.linnet" import smollm2_135m',
        "Declare the preset in this file, with the imported config: `preset p = Llama { ... }`.",
    ),
    # ----- L2xx shapes
    Code(
        "L201",
        "shapes don't broadcast",
        "error",
        "Elementwise operands must have equal dims or a dim of 1, aligned from the right. Dims are "
        "compared by value under the config being checked.",
        "q + k   # [B, S, 576] and [B, S, 192]",
        "Project or rearrange one operand first.",
    ),
    Code(
        "L202",
        "matmul shapes don't match",
        "error",
        "`a @ b` contracts the last dim of `a` with the second-to-last of `b` (batch dims broadcast).",
        "x @ w   # [B, S, 576] @ [1536, 576]",
        "Transpose the weight: `x @ transpose(w)`.",
    ),
    Code(
        "L203",
        "argument shape mismatch",
        "error",
        "An argument's shape does not unify with the callee's parameter type: a dim differs from the "
        "one the signature requires (possibly bound by an earlier argument), or the ranks differ.",
        "rms_norm(x, weight, eps)  # x: [B, S, 192], weight: [576]",
        "Pass a tensor of the declared shape.",
    ),
    Code(
        "L204",
        "return type mismatch",
        "error",
        "A function's value does not have its declared return type.",
        "fn f(x: [B, S, 4]) -> [B, S, 8] { x }",
        "Fix the body or the declared type.",
    ),
    Code(
        "L205",
        "element counts don't match",
        "error",
        "`reshape` and `rearrange` keep the number of elements: the product of the dims before must "
        "equal the product after, and a group `(h d)` must equal the dim it splits.",
        'rearrange(x, "b s (h d) -> b h s d", h=9, d=60)  # 540 != 576',
        "Fix the sizes.",
    ),
    Code(
        "L206",
        "not divisible",
        "error",
        "Dims are integers and division must be exact: `a / b` where `b` does not divide `a` (a head "
        "count that doesn't divide the hidden size, GQA query heads that the KV heads don't divide), "
        "or a division that is not provably exact for every value of a dim variable.",
        "attention(q, k, v, ...)  # 32 query heads, 5 KV heads",
        "Use sizes that divide; in a generic signature write the multiple (`[Hkv * G, ...]`).",
    ),
    Code(
        "L207",
        "invalid rearrange pattern",
        "error",
        "The einops-style pattern is malformed, uses an axis on the right that is not on the left, "
        "repeats an axis, or leaves a group with more than one unknown size.",
        'rearrange(x, "b s (h d) -> b h s e", h=9)',
        "Fix the pattern; the error points inside the string.",
    ),
    Code(
        "L208",
        "rank mismatch",
        "error",
        "A dim index is out of range for the tensor's rank, or an op needs a rank it doesn't have "
        "(including a leading `...` whose rank is not known).",
        "sum(x, dim=3)  # x: [B, S, D]",
        "Use a dim in range; negative dims count from the end.",
    ),
    Code(
        "L209",
        "cannot infer dim",
        "error",
        "A dim variable of the callee's signature cannot be determined from the arguments.",
        "fn f(x: [A * B]) -> [A] { ... }",
        "Give each dim variable a position where it stands alone.",
    ),
    Code(
        "L210",
        "shape changes on assignment",
        "error",
        "Assigning to a local or to module state must keep its type: a loop-carried value and a KV "
        "cache have one shape.",
        "h = mlp_up(h)   # [B, S, 576] becomes [B, S, 1536]",
        "Use a new `let` for the new value.",
    ),
    Code(
        "L211",
        "split or concat sizes don't match",
        "error",
        "The sizes given to `split` must add up to the dim split; tensors given to `concat` must agree "
        "on every other dim.",
        "split(qkv, [768, 768, 768], dim=-1)  # qkv: [B, S, 2304]",
        "Fix the sizes.",
    ),
    Code(
        "L212",
        "index out of range",
        "error",
        "A constant index or slice bound lies outside a dim of known size. So is a symbolic slice bound whose sign "
        "the checker cannot tell: `x[:, :N - K]` of `[B, N]` is negative where N is less than K, which Python "
        "counts from the end (a bound negative for every size, `x[:, -K:]`, counts from the end as Python's does).",
        "x[:, 5]  # x: [B, 4]",
        "Index within the dim; for a symbolic bound, declare the dim with what the bound takes away (`x: [B, K + E]`, "
        "then `x[:, :E]`), or use concrete values.",
    ),
    Code(
        "L213",
        "negative dim",
        "error",
        "Dims are sizes: a dim (or a submodule list's length) that comes out negative under a config, "
        "an op that would make one (`zeros([N, -1])`), or a call of a function whose return type does with "
        "the call's sizes (`fn crop(x: [B, N], k: int) -> [B, N - k]` called with N = 8, k = 11), is refused. "
        "So is a parameter pattern that a call's dim would solve to a negative size, or to one not provably a "
        "size: `x: [B, 4 + E]` given `[B, 2]` (E = -2), or given `[B, S]` (E = S - 4, negative where S is less "
        "than 4). So is a declared dim negative for every size of its dim variables (`-> [B, 0 - A]`, `[B, -A - 1]`: "
        "each dim variable is at least 1); one whose sign is only unknown (`[B, N - K]`) is the declaration's claim.",
        "preset p = C { hidden = -8 }   # w: [c.hidden, 4]",
        "Use sizes of 0 or more; a caller whose dim must hold 4 rows declares it so (`x: [B, 4 + E]`).",
    ),
    Code(
        "L214",
        "window larger than its input",
        "error",
        "A convolution's or pooling's window (its kernel, spread by the dilation) must fit in the input's "
        "spatial size plus its padding: PyTorch refuses it at run time; Linnet names both sizes when it "
        "checks the call. A layer of the standard library (`Conv2d`) is checked for every size, then again at "
        "each call with the call's sizes: a preset that makes the window too large is reported at the call "
        "(`` `conv` with these sizes: ... ``), the layer's line labelled.",
        "conv2d(x, weight)  # x: [B, 3, 8, 8], weight: [64, 3, 16, 16]",
        "Use a smaller kernel, pad the input, or feed a larger one.",
    ),
    Code(
        "L215",
        "channels don't match",
        "error",
        "A convolution's input is channels first, `[B, C, H, W]` as PyTorch lays it out, and its dim 1 must "
        "equal the weight's `in_channels / groups` times `groups`. An input whose last dim has the expected "
        "count is channels-last: the note says so.",
        "conv2d(x, weight)  # x: [B, 224, 224, 3], weight: [64, 3, 7, 7]",
        'Move the channels to dim 1 (`rearrange(x, "b h w c -> b c h w")`) or fix the weight.',
    ),
    Code(
        "L216",
        "argument out of range",
        "error",
        "A compile-time argument of an op lies outside the values the op is defined for: `dropout`'s "
        "probability `p` must be in [0, 1) (p is the chance an element is zeroed while training; p = 1 would "
        "zero the whole input and divide by 0 in its scale 1 / (1 - p)); `repeat_interleave`'s `repeats` must be "
        "1 or more. A constant must also fit the dtype "
        "it is used in: `ids + 10000000000` with `ids: i32[B, S]` (PyTorch and XLA wrap it around, ONNX "
        "Runtime refuses the model), `full([n], 1e40, f32)` (inf).",
        "dropout(x, 1.5)",
        "Pass a value in the range the message names.",
    ),
    # ----- L3xx dtypes
    Code(
        "L301",
        "mixed float dtypes",
        "error",
        "Float dtypes never mix implicitly: the working dtype with f32, or f16 with bf16. This is what "
        "lets `equivalent` numerics follow the reference's casts exactly.",
        "h + variance  # [B, S, D] (working dtype) and f32[B, S, 1]",
        "Cast one side: `cast(variance, h.dtype)`.",
    ),
    Code(
        "L302",
        "int and float mixed",
        "error",
        "Integer tensors don't meet float tensors or float literals without a cast, and integer widths don't mix.",
        "positions * 0.5",
        "Cast first: `cast(positions, f32) * 0.5`.",
    ),
    Code(
        "L303",
        "wrong dtype",
        "error",
        "An op or parameter needs a dtype class the value doesn't have: indices must be integers, a "
        "`where` condition bool, `exp` a float.",
        "take(weight, cast(ids, f32), dim=0)",
        "Pass a value of the dtype named.",
    ),
    Code(
        "L304",
        "argument dtype mismatch",
        "error",
        "An argument's dtype does not match the callee's parameter (the working dtype, a fixed dtype or "
        "a dtype variable bound by an earlier argument).",
        "rms_norm(cast(x, f32), weight, eps)",
        "Cast the argument to the declared dtype.",
    ),
    Code(
        "L305",
        "return dtype mismatch",
        "error",
        "A function's value does not have its declared dtype.",
        "fn f(x: [N]) -> f32[N] { x }",
        "Cast the result.",
    ),
    Code(
        "L306",
        "branches differ",
        "error",
        "The two branches of an `if` (or of `where`) produce values of different types.",
        "if c.flag { x } else { cast(x, f32) }",
        "Make both branches produce one type.",
    ),
    # ----- L4xx configs and presets
    Code(
        "L401",
        "config value has the wrong type",
        "error",
        "A preset or default gives a config field a value of the wrong type, or a string outside the "
        "field's literal union. A float is never an int silently, even a whole one: "
        "`rotary_dim: int = head_dim * partial_rotary_factor` is refused.",
        'rope_type = "lama3"',
        "Use a value of the field's type; literal unions list the allowed values; convert a float "
        "with `int(...)`, which truncates toward zero as Python's `int()` does.",
    ),
    Code(
        "L402",
        "unknown config field",
        "error",
        "A preset or record literal sets a field the config does not declare.",
        "preset p = Llama { hiden_size = 576 }",
        "Use the suggested field name.",
    ),
    Code(
        "L403",
        "missing config field",
        "error",
        "A config field has no default and the preset does not set it.",
        "preset p = Llama { }  # vocab_size has no default",
        "Set the field in the preset.",
    ),
    Code(
        "L404",
        "config value doesn't divide",
        "error",
        "A derived field divides by a value that doesn't divide it under a preset (a head count that "
        "doesn't divide the hidden size), or a config value divides by zero (`/`, `//`, `%`).",
        "head_dim: int = hidden_size / num_attention_heads  # 576 / 10",
        "Fix the preset's values.",
    ),
    Code(
        "L405",
        "condition not known at compile time",
        "error",
        "`if` selects code and members when the model is loaded, so its condition must be a "
        "compile-time bool (config fields, module parameters, comparisons of them).",
        "if x > 0 { ... }  # x is a tensor",
        "For a per-element choice use `where(cond, a, b)`.",
    ),
    Code(
        "L406",
        "optional config value is none",
        "error",
        "A field of an optional config record is read where the record is `none` under this config.",
        "c.rope_scaling.factor  # rope_scaling = none",
        "Guard the use with `if c.rope_scaling != none { ... }`.",
    ),
    Code(
        "L408",
        "constant has no value",
        "error",
        "Compile-time arithmetic (config values, literals, scalars folded in a body) gave no finite "
        "real number: division by zero, a complex root, an overflow, an int over 4096 bits.",
        "v: float = 0.0 ** -1.0",
        "Fix the arithmetic.",
    ),
    Code(
        "L407",
        "unknown config type",
        "error",
        "A preset or record literal names a type that is not a config.",
        "preset p = Lama { }",
        "Use the suggested config name.",
    ),
    Code(
        "L409",
        "config lacks a field the module reads",
        "error",
        "A module or function declared over one config (`module LlamaMLP(c: Llama)`) is given another "
        "(`LlamaMLP(c)` with `c: Mistral`). That is allowed when the given config declares every field of "
        "the declared one that the module reads, directly or through the modules and functions it passes "
        "`c` to, with a type the declaration accepts: the same type, a one-value type of it (`false` for "
        "`bool`), or the non-optional form of an optional type. The message names the field, both configs "
        "and where the field is read.",
        "LlamaMLP(c)  # c: Mistral, which has no `mlp_bias`",
        "Declare the field in the given config (a one-value type such as `mlp_bias: false = false` when "
        "the family has one value), or write the module over the given config.",
    ),
    # ----- L5xx checkpoints
    Code(
        "L501",
        "parameter shape doesn't match checkpoint",
        "error",
        "A tensor in the checkpoint has a different shape from the parameter the source declares at "
        "that path. The message names the tensor and both shapes.",
        "model.layers.0.self_attn.k_proj.weight: checkpoint [192, 576], source [576, 576]",
        "Check the preset against the checkpoint's config.json.",
    ),
    Code(
        "L502",
        "checkpoint names don't match",
        "error",
        "Names are checked both ways: a parameter missing from the checkpoint, or a checkpoint tensor "
        "no parameter takes (unless the model is `@takes_part`: then a note), or every parameter found "
        "under two prefixes. A stored `lm_head.weight` under `tie_word_embeddings: true` is accepted only "
        "when it equals the embeddings bit for bit (transformers uses a stored head even when tied).",
        "missing: lm_head.weight",
        "Fix the module tree or add `@name(...)`; a model that loads a part of its checkpoints (an "
        'encoder without the task head) says so with `@takes_part`, or `@takes_part("prefix")` to '
        "name the prefix to load.",
    ),
    Code(
        "L503",
        "checkpoint config key not declared",
        "error",
        "A checkpoint's config (config.json or GGUF metadata) or a `--config` override has a key that is "
        "not a field of the source's config, not one of the bookkeeping keys transformers writes for every "
        "model (`architectures`, `torch_dtype`, token ids, ...), and not listed by the config's `@inert(...)`. "
        "Linnet cannot tell whether such a key changes the computation, and ignoring one that does "
        "(Phi-3's `partial_rotary_factor` in a Llama file) would run silently wrong, so the load stops.",
        '"partial_rotary_factor": 0.5  # in the config.json of a checkpoint loaded with llama.linnet',
        "Load the checkpoint with a source that declares the key; if it does not change the outputs, list it "
        'in `@inert("...")` on the config; fix a misspelt `--config` key.',
    ),
    Code(
        "L504",
        "parameter dtype doesn't match checkpoint",
        "error",
        "The checkpoint stores the tensor a parameter takes with an integer or bool dtype; parameters are "
        "floating point (f32, f16, bf16, f64, or a quantized GGUF type). The message names the tensor, "
        "its dtype and shape, and the parameter.",
        "model.layers.0.self_attn.q_proj.weight is i32 [64, 64], a parameter takes floating point",
        "The checkpoint is corrupt or was written with the wrong dtype: convert it again.",
    ),
    Code(
        "L505",
        "config value out of range",
        "error",
        "A checkpoint's config (config.json or GGUF metadata) or a `--config` value gives a number outside "
        "the range the computation is defined on, for a key whose meaning is Hugging Face's: a negative "
        "normalization epsilon (`rms_norm_eps`, `layer_norm_eps`, ...) takes the square root of a negative "
        "number, a `rope_theta` or rope scaling `factor` of zero or less gives NaN or meaningless positions. "
        "Such a model would run to NaN logits and empty text, so the load stops, naming the key.",
        '"rms_norm_eps": -1.0  # in a config.json',
        "Fix the value in the checkpoint's config (or override it with `--config`).",
    ),
    Code(
        "L506",
        "checkpoint cannot be read",
        "error",
        "The weights a preset names in the editor (`@weights(...)`, the `linnet.weights` setting) cannot be "
        "opened (`linnet check --weights W` stops with exit status 2 instead): no such file or folder, an "
        "embedded id whose package is not installed, a folder without config.json or safetensors, a corrupt "
        "header. Only headers are read (safetensors' JSON header, GGUF metadata and tensor table, config.json), so the "
        "message names the file and what is wrong with it.",
        '@weights("checkpoints/missing-folder")',
        "Fix the path (relative to the `.linnet` file), install the package the embedded id comes from, or "
        "convert the weights to safetensors.",
    ),
    Code(
        "L507",
        "config field a checkpoint never sets",
        "error",
        "The source's config declares a field named as a key of the checkpoint's config.json that loading reads "
        "under other names: transformers 5's `rope_parameters` (for one attention type) becomes `rope_theta` and "
        "`rope_scaling`, the keys transformers 4 wrote and the sources in linnet/std read. A field called "
        "`rope_parameters` would keep its default whatever the checkpoint says (a scaled rotary embedding run "
        "unscaled), so the load stops. A per-layer-type `rope_parameters` (a dict of such dicts, ModernBERT's "
        "and Gemma 3's) is kept as it is and may be declared.",
        "rope_parameters: RopeScaling? = none  # in config Llama, loading a transformers 5 checkpoint",
        "Declare `rope_theta: float` and `rope_scaling: RopeScaling?` (linnet/std/rope.linnet) instead.",
    ),
    # ----- L9xx style warnings
    Code(
        "L901",
        "unused binding",
        "warning",
        "A `let` binding is never used. Prefix the name with `_` to keep it deliberately.",
        "let unused = x * 2",
        "Remove it or use it.",
    ),
    Code(
        "L902",
        "shadowed binding",
        "warning",
        "A `let` redeclares a name already bound in the same function, hiding the first value.",
        "let h = ...\nlet h = ...",
        "Assign with `h = ...`, or choose a new name.",
    ),
    Code(
        "L903",
        "unused value",
        "warning",
        "An expression statement's value is discarded (only the last expression of a block is its value).",
        "x + 1\nlet y = x",
        "Bind it with `let` or remove it.",
    ),
    Code(
        "L904",
        "parameter or state never read",
        "warning",
        "A parameter (loaded from the checkpoint) or a `state` tensor of the root model that no entry reads, under "
        "the configs named. Reads are followed from every `entry fn` through the methods and submodules it calls; "
        "a use of the member's value anywhere in a function reached counts (a tied head reading "
        "`model.embed_tokens.weight` reads the embedding), in the branches the config takes; the elements of a "
        "list count as one. State is read when it is used other than to compute its own next value "
        "(`k_cache = cache_write(k_cache, ...)` alone is a write), by any entry (a cache one entry writes and "
        "another reads is read). Usually a porting mistake: a norm left out, another member called in its place, "
        "a cache written but attended past. Reported on the outermost member whose tensors are all unread, and "
        'only in a file without errors. A member marked `@unread("why")` is not reported, unless an entry reads it '
        "(then the mark is).",
        "post_attention_layernorm: RMSNorm(c.hidden_size)\n...\nx + mlp(input_layernorm(x))  # the wrong norm",
        "Call the member where the reference does, or remove it (and its tensors from the checkpoint's expected "
        "names) if the model really does not use it.",
    ),
]

CODES: dict[str, Code] = {c.code: c for c in _ALL}


def docs_markdown() -> str:
    """The docs page for every code (docs/diagnostics.md)."""
    out = [
        "# Linnet diagnostics",
        "",
        "Every diagnostic has a stable code. The language server links each one here. Generated "
        "from `linnet/semantics/codes.py`; do not edit by hand.",
        "",
        "| code | title | severity |",
        "|---|---|---|",
    ]
    for c in _ALL:
        out.append(f"| [{c.code}](#{c.code.lower()}) | {c.title} | {c.severity} |")
    for c in _ALL:
        out += [
            "",
            f"## {c.code}",
            "",
            f"**{c.title}** ({c.severity})",
            "",
            c.explanation,
            "",
            "Example:",
            "",
            "```",
            c.example,
            "```",
            "",
            f"Fix: {c.fix}",
        ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(docs_markdown(), end="")
