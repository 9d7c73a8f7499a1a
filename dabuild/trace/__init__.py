"""Frontends that turn framework models into dabuild Graphs (see base.py for how one is chosen)."""

from dabuild.trace.base import TracerPlugin, load_model, trace_model, trace_stage

__all__ = ["TracerPlugin", "load_model", "trace_model", "trace_stage"]
