" Vim syntax file for the .shard language of shardc (docs/language.md).
" Install: copy editors/vim/syntax and editors/vim/ftdetect into ~/.vim (or a package's start
" directory). The word lists must equal the lexer's keywords (grammar/lexer.re), the builtin
" functions (compiler/ir/ir_build.c), the dtypes (compiler/sema/program.h, DTYPES) and the train
" step's keys (program.h, STEP_KEYS): tests/editors/check_grammars.cmake fails when one misses or
" adds a word.

if exists("b:current_syntax")
  finish
endif

syn keyword shardDeclaration import target mesh dim layout model param fn train serve
syn keyword shardControl let return for in
syn keyword shardDtype f32 bf16 f16 f8e4m3 f8e5m2 i32 i8
syn keyword shardBuiltin exp log sqrt rsqrt tanh sigmoid relu gelu silu sum mean max softmax rmsnorm layernorm contract split merge take causal route size dropout
" A step key only where it starts a `key = value` line (a train block's body).
syn keyword shardStepKey loss optimizer master remat microbatches schedule lr zero contained
syn match shardKeyValue "^\s*\h\w*\ze\s*=[^=]" contains=shardStepKey

syn match shardNumber "\<\d\+\%(_\d\+\)*\%(\.\d\+\%(_\d\+\)*\)\=\%([eE][+-]\=\d\+\)\="
syn match shardOperator "->\|@\|[-+*/=]"
syn region shardString start=+"+ end=+"+ end=+$+ oneline
syn match shardComment "#.*$" contains=shardTodo,@Spell
syn keyword shardTodo TODO FIXME XXX contained

hi def link shardDeclaration Keyword
hi def link shardControl Statement
hi def link shardDtype Type
hi def link shardBuiltin Function
hi def link shardStepKey Identifier
hi def link shardNumber Number
hi def link shardOperator Operator
hi def link shardString String
hi def link shardComment Comment
hi def link shardTodo Todo

let b:current_syntax = "shard"
