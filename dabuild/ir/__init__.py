"""dabuild's intermediate representation: the graph every frontend produces and every stage reads."""

from dabuild.ir.graph import Graph, Node, TensorSpec

__all__ = ["Graph", "Node", "TensorSpec"]
