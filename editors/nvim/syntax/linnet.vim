" Vim syntax file for Linnet (.linnet), a statically checked language for neural-network models.
" It follows the VS Code grammar (vscode-extension/syntaxes/linnet.tmLanguage.json): the same
" categories, linked to the standard highlight groups.
if exists("b:current_syntax")
  finish
endif

let s:cpo_save = &cpo
set cpo&vim

" Among items that match at the same column Vim takes the one defined last, and keywords
" before any match: so general patterns come first, special cases after them.

" ----- names and calls
syn match linnetProperty "\.\@1<=\h\w*"
syn match linnetCall "\<\h\w*\ze\s*("
" A member, config field or parameter being declared: `name: type` (a space follows the
" colon; in a slice `x[a:b]` none does).
syn match linnetDeclaredName "\<\h\w*\ze\s*:\%(\s\|$\)"
syn match linnetKeywordArg "\<\h\w*\ze=[^=]"
syn match linnetTypeName "\<\u\w*\ze\s*[({?]"
syn match linnetTypeName "\%(\<\h\w*\s*:\s*\)\@80<=\u\w*\>\ze\s*\%(?\|,\|)\|=\|$\)"
" The builtins (ops, then the standard library's functions) and standard types below are
" generated from the op registry and the standard library by `make docs` (python -m linnet.docgen).
syn match linnetBuiltin "\<\%(abs\|adaptive_avg_pool2d\|add\|arange\|argmax\|avg_pool2d\|cache_write\|cast\|concat\|conv1d\|conv2d\|conv_transpose2d\|cos\|div\|dropout\|eq\|erf\|exp\|expand\|floor_divide\|full\|ge\|gt\|interpolate\|le\|linear\|log\|logical_and\|logical_not\|logical_or\|lt\|matmul\|max\|max_pool2d\|maximum\|mean\|min\|min_value\|minimum\|mod\|mul\|ne\|neg\|ones\|pad\|permute\|pow\|rearrange\|repeat_interleave\|reshape\|rsqrt\|select\|sigmoid\|sin\|slice\|split\|sqrt\|squeeze\|sub\|sum\|take\|tanh\|tensor\|top_k\|transpose\|unsqueeze\|where\|zeros\)\ze\s*("
syn match linnetBuiltin "\<\%(apply_rope\|attention\|attention_with_sinks\|bidirectional_window_mask\|causal_mask\|gather_matmul\|gelu\|gelu_tanh\|layer_norm\|llama3_inv_freq\|padding_mask\|rms_norm\|rope_cos_sin\|rope_inv_freq\|rotate_half\|silu\|sliding_window_mask\|softmax\|top_k_mask\)\ze\s*("

" ----- types
syn keyword linnetDtype f64 f32 f16 bf16 i64 i32
" `bool` is both a scalar type and a dtype (`bool[S, S]`); either way it is a type.
syn keyword linnetPrimitive int float bool str list
syn keyword linnetStdType BatchNorm2d Conv1d Conv2d Embedding GroupNorm LayerNorm LayerNorm2d Linear RMSNorm RopeScaling
syn keyword linnetLoadTimeDim max_batch max_positions

" ----- literals
syn match linnetNumber "\<\d\%(_\?\d\)*\>"
syn match linnetFloat "\<\d\%(_\?\d\)*\.\d\%(_\?\d\)*\%([eE][+-]\?\d\+\)\?\>"
syn match linnetFloat "\<\d\%(_\?\d\)*[eE][+-]\?\d\+\>"
syn keyword linnetBoolean true false
syn keyword linnetNone none
syn region linnetString start=+"+ skip=+\\.+ end=+"\|$+ oneline contains=linnetEscape
syn match linnetEscape +\\.+ contained

" ----- operators
syn match linnetOperator "->\|==\|!=\|<=\|>=\|\*\*\|[-+*/%<>=|?@]"
syn match linnetEllipsis "\.\.\."
syn keyword linnetLogical and or not

" ----- keywords and definitions
syn keyword linnetConditional if else
syn keyword linnetRepeat for
syn match linnetRepeat "\%(\<for\s\+\h\w*\s\+\)\@80<=in\>"
syn keyword linnetStatement let
syn match linnetStatement "\<state\ze\s\+\h"
syn match linnetEntry "\<entry\ze\s\+fn\>"
syn match linnetDefine "\<fn\>" nextgroup=linnetFunctionName skipwhite
syn match linnetFunctionName "\h\w*" contained
" Items start in column 0 (or right after their attributes).
syn match linnetDefine "\%(^\|)\s\+\)\@<=\%(config\|module\|model\)\>" nextgroup=linnetTypeDef skipwhite
syn match linnetDefine "\%(^\|)\s\+\)\@<=preset\>" nextgroup=linnetPresetName skipwhite
syn match linnetTypeDef "\h\w*" contained
syn match linnetPresetName "\h\w*" contained
" Imports: `from "llama.linnet" import A, B as C`, `from std.nn import Linear`; `import` and
" `as` are keywords only on a line that starts with `from`.
syn match linnetInclude "^from\>"
syn match linnetInclude "\%(^from\s.*\)\@200<=\<\%(import\|as\)\>"
" `@name("...")`, `@weights("...")`; `x @ w` is the matmul operator.
syn match linnetAttribute "\%([[:alnum:]_)\]]\)\@1<!@\h\w*\ze\s*("

" ----- comments (`##` lines document the definition below them)
syn keyword linnetTodo TODO FIXME XXX NOTE contained
syn match linnetComment "#.*$" contains=linnetTodo,@Spell
syn region linnetDocComment start="^\s*##" end="$" oneline contains=linnetDocCode,linnetTodo,@Spell
syn match linnetDocCode "`[^`]*`" contained

hi def link linnetCall          Function
hi def link linnetBuiltin       Function
hi def link linnetFunctionName  Function
hi def link linnetProperty      Identifier
hi def link linnetDeclaredName  Identifier
hi def link linnetKeywordArg    Identifier
hi def link linnetTypeName      Type
hi def link linnetTypeDef       Type
hi def link linnetStdType       Type
hi def link linnetDtype         Type
hi def link linnetPrimitive     Type
hi def link linnetPresetName    Constant
hi def link linnetLoadTimeDim   Special
hi def link linnetNumber        Number
hi def link linnetFloat         Float
hi def link linnetBoolean       Boolean
hi def link linnetNone          Constant
hi def link linnetString        String
hi def link linnetEscape        SpecialChar
hi def link linnetOperator      Operator
hi def link linnetLogical       Operator
hi def link linnetEllipsis      Special
hi def link linnetConditional   Conditional
hi def link linnetRepeat        Repeat
hi def link linnetStatement     Statement
hi def link linnetEntry         StorageClass
hi def link linnetDefine        Keyword
hi def link linnetAttribute     PreProc
hi def link linnetInclude       Include
hi def link linnetComment       Comment
hi def link linnetDocComment    SpecialComment
hi def link linnetDocCode       Special
hi def link linnetTodo          Todo

let b:current_syntax = "linnet"

let &cpo = s:cpo_save
unlet s:cpo_save
