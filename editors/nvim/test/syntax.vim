" Checks editors/nvim against a few lines of Linnet; exits 1 on a failure.
"   nvim --headless -u NONE -i NONE -S editors/nvim/test/syntax.vim
let s:root = expand('<sfile>:p:h:h')
execute 'set runtimepath^=' . fnameescape(s:root)
filetype plugin indent on
syntax enable

let s:failures = []

" The syntax group at the `occurrence`-th `needle` on the line.
function! s:GroupAt(line, needle, occurrence) abort
  enew!
  setfiletype linnet
  call setline(1, a:line)
  let col = -1
  for _ in range(a:occurrence)
    let col = stridx(a:line, a:needle, col + 1)
  endfor
  if col < 0
    return '<needle not found>'
  endif
  return synIDattr(synID(1, col + 1, 1), 'name')
endfunction

function! s:Expect(line, needle, group, ...) abort
  let actual = s:GroupAt(a:line, a:needle, get(a:, 1, 1))
  if actual !=# a:group
    call add(s:failures, printf('%s | %s: expected %s, got %s', a:line, a:needle, a:group, actual))
  endif
endfunction

call s:Expect('# a comment', 'comment', 'linnetComment')
call s:Expect('## Sizes of `hidden_size`.', 'Sizes', 'linnetDocComment')
call s:Expect('## Sizes of `hidden_size`.', 'hidden', 'linnetDocCode')
call s:Expect('config Encoder {', 'config', 'linnetDefine')
call s:Expect('config Encoder {', 'Encoder', 'linnetTypeDef')
call s:Expect('    vocab_size: int = 1000', 'vocab_size', 'linnetDeclaredName')
call s:Expect('    vocab_size: int = 1000', 'int', 'linnetPrimitive')
call s:Expect('    vocab_size: int = 1000', '1000', 'linnetNumber')
call s:Expect('    eps: float = 1e-6', '1e-6', 'linnetFloat')
call s:Expect('    rope: RopeScaling? = none', 'RopeScaling', 'linnetStdType')
call s:Expect('    pooling: Pooling? = none', 'Pooling', 'linnetTypeName')
call s:Expect('    pooling: Pooling? = none', 'none', 'linnetNone')
call s:Expect('    mode: "mean" | "first" = "mean"', 'mean', 'linnetString')
call s:Expect('@weights("smollm2-135m-instruct")', '@weights', 'linnetAttribute')
call s:Expect('preset tiny = Encoder { vocab_size = 500, tied = true }', 'preset', 'linnetDefine')
call s:Expect('preset tiny = Encoder { vocab_size = 500, tied = true }', 'tiny', 'linnetPresetName')
call s:Expect('preset tiny = Encoder { vocab_size = 500, tied = true }', 'Encoder', 'linnetTypeName')
call s:Expect('preset tiny = Encoder { vocab_size = 500, tied = true }', 'true', 'linnetBoolean')
call s:Expect('@weights("x") preset tiny = Encoder {}', 'preset', 'linnetDefine')
call s:Expect('from "llama.linnet" import LlamaMLP, LlamaAttention as Attention', 'from', 'linnetInclude')
call s:Expect('from "llama.linnet" import LlamaMLP, LlamaAttention as Attention', 'import', 'linnetInclude')
call s:Expect('from "llama.linnet" import LlamaMLP, LlamaAttention as Attention', 'as', 'linnetInclude')
call s:Expect('from "llama.linnet" import LlamaMLP, LlamaAttention as Attention', 'llama', 'linnetString')
call s:Expect('    let as = x', 'as', '')
call s:Expect('model Mlp(c: MlpConfig) {', 'model', 'linnetDefine')
call s:Expect('model Mlp(c: MlpConfig) {', 'Mlp', 'linnetTypeDef')
call s:Expect('model Mlp(c: MlpConfig) {', 'MlpConfig', 'linnetTypeName')
call s:Expect('    model: LlamaModel(c)', 'model', 'linnetDeclaredName')
call s:Expect('    fc1: Linear(c.in_features, c.hidden_features)', 'Linear', 'linnetStdType')
call s:Expect('    fc1: Linear(c.in_features, c.hidden_features)', 'in_features', 'linnetProperty')
call s:Expect('    state k_cache: [max_batch, c.heads, max_positions, c.head_dim]', 'state', 'linnetStatement')
call s:Expect('    state k_cache: [max_batch, c.heads, max_positions, c.head_dim]', 'max_batch', 'linnetLoadTimeDim')
call s:Expect('    entry fn forward(x: [B, c.in_features]) -> [B, c.out_features] {', 'entry', 'linnetEntry')
call s:Expect('    entry fn forward(x: [B, c.in_features]) -> [B, c.out_features] {', 'fn', 'linnetDefine')
call s:Expect('    entry fn forward(x: [B, c.in_features]) -> [B, c.out_features] {', 'forward', 'linnetFunctionName')
call s:Expect('    entry fn forward(x: [B, c.in_features]) -> [B, c.out_features] {', 'x', 'linnetDeclaredName')
call s:Expect('    entry fn forward(x: [B, c.in_features]) -> [B, c.out_features] {', '->', 'linnetOperator')
call s:Expect('fn double<T: float>(x: T[...]) -> T[...] {', '...', 'linnetEllipsis')
call s:Expect('fn f(keep: bool[B, S], ids: i64[B]) -> f32[B] {', 'bool', 'linnetPrimitive')
call s:Expect('fn f(keep: bool[B, S], ids: i64[B]) -> f32[B] {', 'i64', 'linnetDtype')
call s:Expect('fn f(keep: bool[B, S], ids: i64[B]) -> f32[B] {', 'f32', 'linnetDtype')
call s:Expect('        let h = gelu(fc1(x))  # hover', 'let', 'linnetStatement')
call s:Expect('        let h = gelu(fc1(x))  # hover', 'gelu', 'linnetBuiltin')
call s:Expect('        let h = gelu(fc1(x))  # hover', 'fc1', 'linnetCall')
call s:Expect('        let h = gelu(fc1(x))  # hover', '# hover', 'linnetComment')
call s:Expect('        x = attn.step(ln_1(h), mask)', 'step', 'linnetCall')
call s:Expect('        split(qkv, [d, d, d], dim=-1)', 'dim', 'linnetKeywordArg')
call s:Expect('        split(qkv, [d, d, d], dim=-1)', 'split', 'linnetBuiltin')
call s:Expect('        transformer(input_ids) @ transpose(w)', '@', 'linnetOperator')
call s:Expect('        if p != none and p.mode == "first" { x } else { y }', 'if', 'linnetConditional')
call s:Expect('        if p != none and p.mode == "first" { x } else { y }', 'and', 'linnetLogical')
call s:Expect('        if p != none and p.mode == "first" { x } else { y }', 'else', 'linnetConditional')
call s:Expect('        if p != none and p.mode == "first" { x } else { y }', 'mode', 'linnetProperty')
call s:Expect('        for block in h {', 'for', 'linnetRepeat')
call s:Expect('        for block in h {', 'in', 'linnetRepeat')
call s:Expect('        x[:, :H]', 'H', '')
call s:Expect('        let big = 1_000 + 10000.0', '1_000', 'linnetNumber')
call s:Expect('        let big = 1_000 + 10000.0', '10000.0', 'linnetFloat')

" The ftplugin and indent settings.
enew!
setfiletype linnet
if &l:commentstring !=# '# %s' || &l:shiftwidth != 4 || !&l:expandtab
  call add(s:failures, printf('ftplugin: commentstring=%s shiftwidth=%d expandtab=%d', &l:commentstring, &l:shiftwidth, &l:expandtab))
endif
call setline(1, ['module M(n: int) {', 'w: [n]  # weights', 'fn f(x: [n]) -> [n] {', 'x', '}', '}'])
normal! gg=G
let s:expected = ['module M(n: int) {', '    w: [n]  # weights', '    fn f(x: [n]) -> [n] {', '        x', '    }', '}']
if getline(1, '$') != s:expected
  call add(s:failures, 'indent: ' . string(getline(1, '$')))
endif

if empty(s:failures)
  echo "editors/nvim: all checks passed\n"
  qall!
endif
for s:failure in s:failures
  echo s:failure . "\n"
endfor
cquit!
