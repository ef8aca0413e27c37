/* ops_fn_end.h: undefines the expression words of ops.def's scalar functions (X0 ... NOFN), after
 * a reader that defined them to build or evaluate the `fn` column (ir_scalar.c, lower_math.c).
 * Deliberately without an include guard: each reader includes it once after its switch. */
#undef X0
#undef X1
#undef X2
#undef X3
#undef S
#undef K
#undef ADD
#undef SUB
#undef MUL
#undef DIV
#undef NEG
#undef EXP
#undef LOG
#undef SQRT
#undef TANH
#undef ERF
#undef POW
#undef SELECT
#undef LE
#undef GT
#undef IF_FLAG
#undef LET
#undef FN
#undef NOFN
