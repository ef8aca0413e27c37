/* lexer.re: the .shard scanner (re2c; generated into build/gen/lexer.c with `re2c -W -Werror`).
 *
 * In: a Source (whole file, NUL-terminated). Out: one Token per lexer_next call, with its SrcLoc
 * {file, line, col, len} (col counts bytes from 1), the slice of source it came from, and for names,
 * strings and numbers their value (names and string contents interned, numbers converted).
 *
 * Lexical rules (docs/language.md): newlines are whitespace; `#` starts a comment to the end of the
 * line. A line ends at "\n", "\r\n" or a lone "\r" (old Mac files), as source_line counts them: a
 * CR-only file is many lines, not one comment. There are no block comments, so "unterminated
 * comment" cannot arise. Identifiers are [A-Za-z_][A-Za-z0-9_]*, at most LEX_MAX_NAME bytes. Integers are digit groups joined by single
 * underscores (4096, 4_096) and must fit in int64; floats are 0.5, 1.97e14, 3e-6 and must be finite.
 * A word starting with digits (1f1b) is a TK_WORD: a value in key = value bodies (`schedule = 1f1b`),
 * a malformed number anywhere else (parse.c says so, knowing where the parser is).
 * Strings are "..." on one line with no escapes (a backslash is an ordinary character).
 *
 * The scanner uses re2c's end-of-input rule ($) with the NUL terminator as sentinel, so a NUL byte
 * inside the file is an ordinary byte to the automaton and is diagnosed by the actions. Every error
 * is reported here and the scanner moves on: a bad byte is skipped, an unterminated string ends at
 * the end of the line, a bad number becomes 0. The parser never sees a broken token. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "diag.h"
#include "lexer.h"
#include "tokens.h"

void lexer_init(Lexer *lx, const Source *src) {
  lx->src = src;
  lx->cur = (const unsigned char *)src->text;
  lx->lim = lx->cur + src->len;
  lx->line_start = lx->cur;
  lx->line = 1;
  lx->end_line = 1;
  lx->end_col = 1;
  for (int k = 0; k <= TK_SERVE; k++) lx->keywords[k] = NULL;
}

static SrcLoc lexer_loc(const Lexer *lx, const unsigned char *start, const unsigned char *end) {
  size_t len = (size_t)(end - start);
  return (SrcLoc){lx->src, lx->line, (int)(start - lx->line_start) + 1,
                  len == 0 ? 1 : len > INT_MAX ? INT_MAX : (int)len};
}

/* Quote a token's text for a message, shortened when long: "4__096", "123456789012...". */
static const char *lexer_quote(const unsigned char *s, size_t len, char *buf, size_t size) {
  size_t keep = len;
  if (keep + 4 > size) keep = size - 4;
  memcpy(buf, s, keep);
  strcpy(buf + keep, keep < len ? "..." : "");
  return buf;
}

/* Report every NUL byte in [s, e): they can hide inside comments and strings. */
static void lexer_check_nul(const Lexer *lx, const unsigned char *s, const unsigned char *e) {
  for (const unsigned char *p = s; (p = memchr(p, 0, (size_t)(e - p))) != NULL; p++)
    diag_error(lexer_loc(lx, p, p + 1), "unexpected NUL byte");
}

/* Integer: digit groups with single underscores (the regex saw to that); > INT64_MAX is an error. */
static void lexer_integer(const Lexer *lx, Token *t, const unsigned char *s, const unsigned char *e) {
  int64_t v = 0;
  for (const unsigned char *p = s; p < e; p++) {
    if (*p == '_') continue;
    if (ckd_mul(&v, v, 10) || ckd_add(&v, v, *p - '0')) {
      char buf[48];
      diag_error(t->loc, "integer literal %s is too large (the limit is %lld)",
                 lexer_quote(s, (size_t)(e - s), buf, sizeof buf), (long long)INT64_MAX);
      v = 0;
      break;
    }
  }
  t->num.i = v;
  t->num.f = (double)v;
}

/* Float: strtod on the text without underscores (in the C locale, the only one shardc uses); a
 * value that overflows to infinity is an error, one that underflows is kept as 0 or subnormal. */
static void lexer_float(const Lexer *lx, Token *t, const unsigned char *s, const unsigned char *e) {
  char small[128], *buf = small;
  size_t n = (size_t)(e - s);
  if (n + 1 > sizeof small && !(buf = malloc(n + 1))) abort();
  size_t k = 0;
  for (const unsigned char *p = s; p < e; p++)
    if (*p != '_') buf[k++] = (char)*p;
  buf[k] = '\0';
  double v = strtod(buf, NULL);
  if (v > 1.7976931348623157e308) {
    char q[48];
    diag_error(t->loc, "float literal %s is out of range (it overflows to infinity)",
               lexer_quote(s, n, q, sizeof q));
    v = 0;
  }
  if (buf != small) free(buf);
  t->num.is_float = true;
  t->num.f = v;
}

static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* digits := [0-9]+ ("_" [0-9]+)*. Returns the end of the digits at p, or NULL if there are none. */
static const unsigned char *lexer_digits(const unsigned char *p, const unsigned char *e) {
  if (p == e || !is_digit(*p)) return NULL;
  for (;;) {
    while (p < e && is_digit(*p)) p++;
    if (p + 1 < e && *p == '_' && is_digit(p[1])) p++;
    else return p;
  }
}

static bool is_alpha(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* number := digits ("." digits)? ([eE] [+-]? digits)?
 * word   := [0-9]+ [A-Za-z] [A-Za-z0-9_]*, not starting like an exponent (1e, 1e5x, 1E+)
 * 0: an integer; 1: a float (it has a '.' or an exponent); 2: a word (1f1b, the pipeline
 * schedule); -1: malformed (4__096, 1e, 1.5x). */
static int lexer_number_shape(const unsigned char *s, const unsigned char *e) {
  const unsigned char *w = s;
  while (w < e && is_digit(*w)) w++;
  if (w < e && is_alpha(*w)) {
    bool exponent_like = (*w == 'e' || *w == 'E') && (w + 1 == e || is_digit(w[1]) || w[1] == '+' || w[1] == '-');
    const unsigned char *q = w;
    while (q < e && (is_alpha(*q) || is_digit(*q) || *q == '_')) q++;
    if (q == e && !exponent_like) return 2;
  }
  const unsigned char *p = lexer_digits(s, e);
  int shape = 0;
  if (p && p < e && *p == '.') p = lexer_digits(p + 1, e), shape = 1;
  if (p && p < e && (*p == 'e' || *p == 'E')) {
    p++;
    if (p < e && (*p == '+' || *p == '-')) p++;
    p = lexer_digits(p, e);
    shape = 1;
  }
  return p == e ? shape : -1;
}

/* Bytes that start no token. Printable ASCII is shown as a character, anything else as a byte; a
 * run of non-ASCII bytes (one UTF-8 character, say) is one diagnostic, not one per byte. */
static const unsigned char *lexer_bad_bytes(const Lexer *lx, const unsigned char *s) {
  const unsigned char *e = s + 1;
  if (*s == 0) {
    diag_error(lexer_loc(lx, s, e), "unexpected NUL byte");
  } else if (*s >= 0x80) {
    while (e < lx->lim && *e >= 0x80) e++;
    diag_error(lexer_loc(lx, s, e),
               "unexpected byte 0x%02x (non-ASCII text is allowed only in strings and comments)", *s);
  } else if (*s > 0x20 && *s < 0x7F) {
    diag_error(lexer_loc(lx, s, e), "unexpected character '%c'", *s);
  } else {
    diag_error(lexer_loc(lx, s, e), "unexpected byte 0x%02x", *s);
  }
  return e;
}

int lexer_next(Lexer *lx, Token *t) {
  const unsigned char *cur = lx->cur, *lim = lx->lim, *tok;
  int kind;
  for (;;) {
    tok = cur;
    /*!re2c
      re2c:define:YYCTYPE = "unsigned char";
      re2c:define:YYCURSOR = cur;
      re2c:define:YYLIMIT = lim;
      re2c:yyfill:enable = 0;
      re2c:eof = 0;

      // Anything that starts like a number and runs on: 4096, 1.97e14, but also 4__096, 1e, 12abc,
      // 1e+. lexer_number_shape then tells the valid forms from the malformed ones.
      number = [0-9] ([0-9A-Za-z_] | [eE][+-])* ("." ([0-9A-Za-z_] | [eE][+-])*)?;

      $ {
        kind = 0;
        break;
      }
      "\r\n" | "\n" | "\r" {
        lx->line++;
        lx->line_start = cur;
        continue;
      }
      [ \t\v\f]+ { continue; }
      "#" [^\n\r]* {
        lexer_check_nul(lx, tok, cur);
        continue;
      }

      "import" { kind = TK_IMPORT; break; }
      "target" { kind = TK_TARGET; break; }
      "mesh"   { kind = TK_MESH; break; }
      "dim"    { kind = TK_DIM; break; }
      "layout" { kind = TK_LAYOUT; break; }
      "model"  { kind = TK_MODEL; break; }
      "param"  { kind = TK_PARAM; break; }
      "fn"     { kind = TK_FN; break; }
      "let"    { kind = TK_LET; break; }
      "return" { kind = TK_RETURN; break; }
      "for"    { kind = TK_FOR; break; }
      "in"     { kind = TK_IN; break; }
      "train"  { kind = TK_TRAIN; break; }
      "serve"  { kind = TK_SERVE; break; }
      [A-Za-z_][A-Za-z0-9_]* { kind = TK_NAME; break; }

      number { kind = TK_NUM; break; }

      ["] [^"\n\r]* ["] { kind = TK_STRING; break; }
      ["] [^"\n\r]* {
        diag_error(lexer_loc(lx, tok, tok + 1), "unterminated string (it needs a closing '\"' on this line)");
        kind = TK_STRING;
        break;
      }

      "{"  { kind = TK_LBRACE; break; }
      "}"  { kind = TK_RBRACE; break; }
      "("  { kind = TK_LPAREN; break; }
      ")"  { kind = TK_RPAREN; break; }
      "["  { kind = TK_LBRACKET; break; }
      "]"  { kind = TK_RBRACKET; break; }
      ","  { kind = TK_COMMA; break; }
      ":"  { kind = TK_COLON; break; }
      "="  { kind = TK_EQ; break; }
      "."  { kind = TK_DOT; break; }
      "@"  { kind = TK_AT; break; }
      "->" { kind = TK_ARROW; break; }
      "+"  { kind = TK_PLUS; break; }
      "-"  { kind = TK_MINUS; break; }
      "*"  { kind = TK_STAR; break; }
      "/"  { kind = TK_SLASH; break; }

      * {
        cur = lexer_bad_bytes(lx, tok);
        continue;
      }
    */
  }
  lx->cur = cur;

  memset(t, 0, sizeof *t);
  t->kind = kind;
  if (kind == 0) {
    t->loc = (SrcLoc){lx->src, lx->end_line, lx->end_col, 1};
    t->text = (const char *)cur;
    return 0;
  }
  t->loc = lexer_loc(lx, tok, cur);
  t->text = (const char *)tok;
  lx->end_line = lx->line;
  lx->end_col = t->loc.col + t->loc.len;
  size_t len = (size_t)(cur - tok);

  if (token_is_keyword(kind)) {
    /* A keyword can name a mesh axis (`model`), so it carries its text as a Name too. */
    if (!lx->keywords[kind]) lx->keywords[kind] = intern((const char *)tok, len);
    t->name = lx->keywords[kind];
  } else if (kind == TK_NAME) {
    if (len > LEX_MAX_NAME) {
      diag_error(t->loc, "identifier too long (%zu bytes; the limit is %d)", len, LEX_MAX_NAME);
      len = LEX_MAX_NAME;
    }
    t->name = intern((const char *)tok, len);
  } else if (kind == TK_STRING) {
    const unsigned char *end = cur[-1] == '"' && len > 1 ? cur - 1 : cur;
    lexer_check_nul(lx, tok + 1, end);
    t->name = intern((const char *)tok + 1, (size_t)(end - tok - 1));
  } else if (kind == TK_NUM) {
    t->num.text = (const char *)tok;
    t->num.text_len = t->loc.len;
    int shape = lexer_number_shape(tok, cur);
    if (shape == 2) {
      /* A word is a value only in key = value bodies; parse.c diagnoses it anywhere else. */
      t->kind = kind = TK_WORD;
      t->name = intern((const char *)tok, len);
    } else if (shape < 0) {
      char buf[48];
      diag_error(t->loc, "malformed number '%s'", lexer_quote(tok, len, buf, sizeof buf));
    } else if (shape == 1) {
      lexer_float(lx, t, tok, cur);
    } else {
      lexer_integer(lx, t, tok, cur);
    }
  }
  return kind;
}

static const char *const token_names[] = {
  [0] = "end of file",
#define X(tok, shown) [TK_##tok] = shown,
  SHARD_TOKENS(X)
#undef X
};

const char *token_kind_name(int kind) {
  if (kind < 0 || kind >= (int)ARRAY_LEN(token_names) || !token_names[kind]) return "a token";
  return token_names[kind];
}

const char *token_text(const Token *t, char *buf, size_t size) {
  return lexer_quote((const unsigned char *)t->text, (size_t)t->loc.len, buf, size);
}

const char *token_describe(const Token *t, char *buf, size_t size) {
  char q[48];
  if (t->kind == 0) snprintf(buf, size, "end of file");
  else if (t->kind == TK_STRING) snprintf(buf, size, "string %s", lexer_quote((const unsigned char *)t->text, (size_t)t->loc.len, q, sizeof q));
  else snprintf(buf, size, "'%s'", lexer_quote((const unsigned char *)t->text, (size_t)t->loc.len, q, sizeof q));
  return buf;
}
