/* tokens.h: the terminals of the .shard grammar and how diagnostics name them.
 *
 * The numbers (TK_*) are Lemon's, generated into parser.h from the %token line of grammar/parser.y;
 * this table only attaches a display name to each, so its order does not matter. One line per token:
 * X(name without TK_, how "expected X, found Y" shows it). Keep it in step with parser.y's %token. */
#ifndef SHARDC_TOKENS_H
#define SHARDC_TOKENS_H

#define SHARD_TOKENS(X)                                                                 \
  /* keywords (fixed by language.md) */                                               \
  X(IMPORT, "'import'") X(TARGET, "'target'") X(MESH, "'mesh'") X(DIM, "'dim'")        \
  X(LAYOUT, "'layout'") X(MODEL, "'model'") X(PARAM, "'param'") X(FN, "'fn'")          \
  X(LET, "'let'") X(RETURN, "'return'") X(FOR, "'for'") X(IN, "'in'")                  \
  X(TRAIN, "'train'") X(SERVE, "'serve'")                                              \
  /* words and literals */                                                            \
  X(NAME, "a name") X(NUM, "a number") X(STRING, "a string")                          \
  X(WORD, "a word such as 1f1b")                                                      \
  /* punctuation */                                                                   \
  X(LBRACE, "'{'") X(RBRACE, "'}'") X(LPAREN, "'('") X(RPAREN, "')'")                  \
  X(LBRACKET, "'['") X(RBRACKET, "']'") X(COMMA, "','") X(COLON, "':'") X(EQ, "'='")   \
  X(DOT, "'.'") X(AT, "'@'") X(ARROW, "'->'") X(PLUS, "'+'") X(MINUS, "'-'")           \
  X(STAR, "'*'") X(SLASH, "'/'")

/* parser.y's %token line lists the keywords first, IMPORT through SERVE. */
#define token_is_keyword(k) ((k) >= TK_IMPORT && (k) <= TK_SERVE)

#endif
