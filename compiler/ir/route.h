/* route.h: mixture-of-experts routing in the IR (language.md, "Routing"; docs/moe.md).
 *
 * `route(l, top: k, over: e, tokens: t, slots: c)` is an OP_ROUTE: a 0/1 tensor with l's dims
 * and c. A value that keeps its pattern (zero wherever the route's result is) is held as k
 * (expert, slot, value) entries per token, never densely: the route's result, its casts, its
 * elementwise products with tensors whose dims are among its own and lack c (language.md's
 * rule), and, made by the compiler, transposes, slices and collectives of one, the sum of two
 * with the same pattern and OP_ROUTE_GRAD's result. Contracting such a value over t dispatches
 * tokens to the experts' slots, over (e, c) combines them back: both move data and count no
 * FLOPs (the executors run them as indexed copies and scatter-adds).
 *
 * ir_route_mark finds all of this from the dataflow and writes it down (Value.route, OP_CONTRACT's
 * Op.flag); it runs after ir_build, around autodiff and after the pass pipeline, and every later
 * reader (costs, memory, the interpreter, explain, the simulator) reads the marks. */
#ifndef SHARDC_ROUTE_H
#define SHARDC_ROUTE_H

#include "ir.h"

/* OP_CONTRACT's Op.flag. */
typedef enum {
  CONTRACT_DENSE,       /* an ordinary contraction */
  CONTRACT_DISPATCH,    /* a patterned operand contracted over its route's token dim (the other
                           operand lacks the slot dim): each slot receives at most one token */
  CONTRACT_COMBINE      /* a patterned operand contracted over its route's expert and slot dims
                           (the other operand lacks the token dim): each token gathers its k
                           entries */
} RouteContract;

/* An entry's expert and slot indices, i32 each; its value has the tensor's dtype. */
#define ROUTE_INDEX_BYTES 8

/* Sets Value.route of every value of m (every function, loop body and pipeline region) and the
 * RouteContract of every contraction, from scratch. Idempotent. */
void ir_route_mark(IrModule *m);
/* The same for f and the regions inside it, its own inputs' marks taken as they are (autodiff
 * marks a step's microbatch body before any loop holds it). */
void ir_route_mark_func(IrFunc *f);

/* op's RouteContract (CONTRACT_DENSE for anything but a marked contraction); *patterned (if not
 * NULL) gets the operand that carries the pattern, -1 for a dense one. */
RouteContract ir_route_contract(const Op *op, int *patterned);

/* The bytes v stores over the bytes it would hold densely, in (0, 1]: k entries per token of
 * ROUTE_INDEX_BYTES + its dtype's bytes against the e x c elements per token a dense tensor holds
 * (never above 1: where the entries would be larger, the tensor is dense). 1 for a dense value.
 * Sharding splits both alike, so it scales a local size too. */
double ir_route_density(const Value *v);
/* The fraction of v's elements that are entries: k / (e x c) for a patterned value, 1 for a dense
 * one (route_grad computes its k dot products per token there). */
double ir_route_fill(const Value *v);

/* The route result v's pattern comes from, following the operands that carry it through v's own
 * function; NULL where it enters the function from outside (a loop input). */
Value *ir_route_source(Value *v);

/* What the op is called in listings: "dispatch" and "combine" for those contractions, else
 * ir_op_name. */
const char *ir_op_label(const Op *op);

#endif
