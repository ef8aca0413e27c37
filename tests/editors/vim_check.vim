" vim_check.vim: editors/vim's syntax file loaded by a real Vim on sample.shard (tests/unit/editors.cmake).
"   vim -Nu NONE -i NONE -es --cmd 'set rtp^=EDITORS/vim' -S vim_check.vim sample.shard  (OUT in the environment)
" Writes one line per position: `line:col word: group` and `ok` or `want GROUP`; then `done`.
" The positions were counted in sample.shard by hand (and by a script over its text), the groups
" are the syntax groups of editors/vim/syntax/shard.vim (what each links to is the file's business).
filetype on
syntax on
doautocmd BufRead
let s:want = [
  \ [1, 1, '#', 'shardComment'], [3, 1, 'import', 'shardDeclaration'], [3, 8, '"targets"', 'shardString'],
  \ [5, 1, 'mesh', 'shardDeclaration'], [5, 23, '2', 'shardNumber'], [6, 1, 'dim', 'shardDeclaration'], [6, 47, '1_024', 'shardNumber'],
  \ [13, 3, 'param', 'shardDeclaration'], [13, 15, 'bf16', 'shardDtype'], [15, 3, 'fn', 'shardDeclaration'], [15, 42, '->', 'shardOperator'],
  \ [16, 5, 'let', 'shardControl'], [16, 13, 'gelu', 'shardBuiltin'], [16, 20, '@', 'shardOperator'], [16, 30, '0.5', 'shardNumber'],
  \ [17, 5, 'return', 'shardControl'], [21, 1, 'train', 'shardDeclaration'], [22, 3, 'loss', 'shardStepKey'],
  \ [22, 10, 'mse', ''], [24, 8, '3e-4', 'shardNumber']]
let s:out = ['filetype ' . &filetype]
for [s:l, s:c, s:word, s:group] in s:want
  let s:got = synIDattr(synID(s:l, s:c, 1), 'name')
  call add(s:out, printf('%d:%d %s: %s %s', s:l, s:c, s:word, s:got, s:got ==# s:group ? 'ok' : 'want ' . s:group))
endfor
call add(s:out, 'done')
call writefile(s:out, $OUT)
qa!
