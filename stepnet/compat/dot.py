"""A small Graphviz writer with the part of pydot's interface Caffe2's net_drawer and its users touch: Dot
(graph attributes such as rankdir), Node, Edge, Cluster (a subgraph), to_string() for the dot text, and
create_*/write_* that run Graphviz's `dot` (absent: an error that says how to install it; write_dot and
write_raw need nothing)."""
from __future__ import annotations

import re
import shutil
import subprocess

from ..core.errors import StepnetError

GRAPHVIZ_HINT = ("Graphviz's `dot` program is not installed (Debian/Ubuntu: apt-get install graphviz); the "
                 ".dot text (to_string(), write_dot) can be rendered elsewhere with `dot -Tsvg graph.dot`")


# A whole dot quoted string: no quote inside but escaped ones, no raw line break, not ending in a lone backslash.
_QUOTED = re.compile(r'"(?:[^"\\\n]|\\[^\n])*"')


def quote(text) -> str:
    """A dot ID: an already quoted string stays as it is (only a well-formed one: a name such as '"a" -> "b"'
    from a file is escaped, never spliced into the graph); anything else is quoted and escaped."""
    text = str(text)
    if _QUOTED.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attrs(attrs: dict) -> str:
    if not attrs:
        return ""
    return " [" + ", ".join(f"{k}={quote(v)}" for k, v in attrs.items()) + "]"


class Node:
    def __init__(self, name, **attrs):
        self.name, self.attrs = str(name), attrs

    def get_name(self) -> str:
        return self.name

    def to_string(self) -> str:
        return quote(self.name) + _attrs(self.attrs) + ";"


class Edge:
    def __init__(self, src, dst, **attrs):
        self.src = src.get_name() if isinstance(src, Node) else str(src)
        self.dst = dst.get_name() if isinstance(dst, Node) else str(dst)
        self.attrs = attrs

    def get_source(self) -> str:
        return self.src

    def get_destination(self) -> str:
        return self.dst

    def to_string(self, arrow: str = "->") -> str:
        return f"{quote(self.src)} {arrow} {quote(self.dst)}{_attrs(self.attrs)};"


class Dot:
    """A graph: nodes (each name once), edges, subgraphs and graph attributes, written as dot text."""

    keyword = "digraph"

    def __init__(self, graph_name="G", graph_type="digraph", **attrs):
        self.name = str(graph_name) if graph_name is not None else "G"
        self.graph_type = graph_type
        self.attrs = attrs
        self._nodes: dict = {}
        self._edges: list = []
        self._subgraphs: list = []

    def get_name(self) -> str:
        return self.name

    def set(self, name, value) -> None:
        self.attrs[name] = value

    def add_node(self, node: Node) -> None:
        self._nodes[node.get_name()] = node

    def add_edge(self, edge: Edge) -> None:
        self._edges.append(edge)

    def add_subgraph(self, graph: "Dot") -> None:
        self._subgraphs.append(graph)

    def get_node(self, name) -> list:
        return [self._nodes[name]] if name in self._nodes else []

    def get_nodes(self) -> list:
        return list(self._nodes.values())

    def get_edges(self) -> list:
        return list(self._edges)

    def _body(self, indent: str, arrow: str) -> list:
        lines = [f"{indent}{k}={quote(v)};" for k, v in self.attrs.items()]
        for sub in self._subgraphs:
            lines += [f"{indent}subgraph {quote(sub.name)} {{"] + sub._body(indent + "  ", arrow) + [f"{indent}}}"]
        lines += [indent + n.to_string() for n in self._nodes.values()]
        lines += [indent + e.to_string(arrow) for e in self._edges]
        return lines

    def to_string(self) -> str:
        arrow = "->" if self.graph_type == "digraph" else "--"
        return "\n".join([f"{self.graph_type} {quote(self.name)} {{", *self._body("  ", arrow), "}"]) + "\n"

    __str__ = to_string

    def create(self, prog: str = "dot", format: str = "png") -> bytes:  # noqa: A002 - pydot's name
        """The graph rendered by Graphviz (`prog -T<format>`)."""
        if format in ("raw", "dot"):
            return self.to_string().encode()
        exe = shutil.which(prog)
        if exe is None:
            raise StepnetError(GRAPHVIZ_HINT)
        done = subprocess.run([exe, f"-T{format}"], input=self.to_string().encode(), capture_output=True,
                              check=False)
        if done.returncode != 0:
            raise StepnetError(f"{prog} -T{format} failed: {done.stderr.decode(errors='replace').strip()}")
        return done.stdout

    def write(self, path, prog: str = "dot", format: str = "raw") -> bool:  # noqa: A002 - pydot's name
        data = self.create(prog, format)
        with open(path, "wb") as f:
            f.write(data)
        return True

    def __getattr__(self, name):
        """create_png, create_svg, ... and write_png, write_svg, write_dot, write_raw, ..."""
        kind, _, fmt = name.partition("_")
        if fmt and kind == "create":
            return lambda prog="dot": self.create(prog, fmt)
        if fmt and kind == "write":
            return lambda path, prog="dot": self.write(path, prog, fmt)
        raise AttributeError(name)


class Cluster(Dot):
    """A subgraph drawn as a box (its name starts with 'cluster')."""

    def __init__(self, graph_name="subG", **attrs):
        name = str(graph_name)
        super().__init__(name if name.startswith("cluster") else "cluster_" + name, "subgraph", **attrs)
