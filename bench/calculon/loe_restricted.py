#!/usr/bin/python3
"""Calculon's llm-optimal-execution with its space restricted: TP, PP and pipeline interleaving
limited to the lists in CAL_TP, CAL_PP, CAL_PPINT (comma-separated); everything else as upstream.
Usage: CALCULON=<a clone of calculon-ai/calculon> CAL_TP=4,8 CAL_PP=8,16 CAL_PPINT=1,2 \
         loe_restricted.py <llm-optimal-execution args>      (CALCULON defaults to /tmp/hplan-calculon)"""
import os, sys, runpy
ROOT = os.environ.get('CALCULON', '/tmp/hplan-calculon')
sys.path.insert(0, ROOT)
from calculon.llm import Llm
def allow(env, gen):
    keep = set(int(x) for x in os.environ[env].split(',')) if os.environ.get(env) else None
    def f(*a):
        return [c for c in gen(*a) if keep is None or c in keep]
    return staticmethod(f)
Llm.get_all_tensor_parallelisms = allow('CAL_TP', Llm.get_all_tensor_parallelisms)
Llm.get_all_pipeline_parallelisms = allow('CAL_PP', Llm.get_all_pipeline_parallelisms)
Llm.get_valid_pipeline_interleavings = allow('CAL_PPINT', Llm.get_valid_pipeline_interleavings)
sys.argv = ['calculon'] + sys.argv[1:]
runpy.run_path(os.path.join(ROOT, 'bin', 'calculon'), run_name='__main__')
