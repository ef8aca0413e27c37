" .shard files (shardc's language): editors/vim/syntax/shard.vim highlights them.
autocmd BufRead,BufNewFile *.shard setfiletype shard
