"""The kubelet's gRPC APIs as message classes, from the project's own .proto files (proto/).

No generated code is shipped: generated ``_pb2`` modules pin the protobuf runtime they were made
for (a module from a 2025 protoc refuses Debian 12's protobuf 3.21), and a build step would need
protoc on every machine that installs ponytail. Instead this module reads the small proto3 subset
the files use (messages, scalar, message, enum, repeated and map fields, enums, services with
unary and server-streaming methods) into descriptors at run time. tests/unit/test_dra_protos.py
checks that what it builds equals protoc's (grpcio-tools) descriptors for the same files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PROTO_DIR = os.path.join(os.path.dirname(__file__), "proto")
_SCALARS = {
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
    "uint32": descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
    "uint64": descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
    "bytes": descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
}


@dataclass(frozen=True)
class Method:
    name: str
    request: Any  # message class
    response: Any
    server_streaming: bool


@dataclass(frozen=True)
class Api:
    """One .proto file: its message classes by name and its services' methods."""

    package: str
    messages: dict[str, Any]
    services: dict[str, tuple[Method, ...]]  # full service name -> methods

    def __getattr__(self, name: str) -> Any:
        try:
            return self.messages[name]
        except KeyError:
            raise AttributeError(name) from None


_LOADED: dict[tuple[str, str], Api] = {}


def load(name: str, package: str | None = None) -> Api:
    """The API of proto/``name``, under ``package`` instead of the file's own when given."""
    key = (name, package or "")
    if key not in _LOADED:
        with open(os.path.join(PROTO_DIR, name), encoding="utf-8") as f:
            proto = parse(f.read(), name if package is None else f"{package}/{name}", package)
        _LOADED[key] = _build(proto)
    return _LOADED[key]


def parse(text: str, file_name: str, package: str | None = None) -> descriptor_pb2.FileDescriptorProto:
    """The FileDescriptorProto of ``text`` (the subset described above); ValueError on anything else."""
    tokens = _tokens(text)
    proto = descriptor_pb2.FileDescriptorProto(name=file_name, syntax="proto3")
    pos = 0
    while pos < len(tokens):
        word = tokens[pos]
        if word == "syntax":
            pos = _expect(tokens, pos + 3, ";") if tokens[pos + 2] == '"proto3"' else _fail("only proto3")
        elif word == "package":
            proto.package = package or tokens[pos + 1]
            pos = _expect(tokens, pos + 2, ";")
        elif word == "option":
            pos = tokens.index(";", pos) + 1
        elif word == "message":
            pos = _message(tokens, pos, proto.message_type.add())
        elif word == "enum":
            pos = _enum(tokens, pos, proto.enum_type.add())
        elif word == "service":
            pos = _service(tokens, pos, proto.service.add())
        else:
            _fail(f"unexpected {word!r}")
    _resolve(proto)
    return proto


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    for line in text.splitlines():
        line = line.split("//", 1)[0]
        for ch in "{}();=<>,":
            line = line.replace(ch, f" {ch} ")
        out += line.split()
    return out


def _expect(tokens: list[str], pos: int, word: str) -> int:
    if pos >= len(tokens) or tokens[pos] != word:
        _fail(f"expected {word!r} at token {pos}")
    return pos + 1


def _fail(why: str) -> int:
    raise ValueError(f"proto: {why}")


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def _json_name(name: str) -> str:
    camel = _camel(name)
    return camel[:1].lower() + camel[1:]


def _message(tokens: list[str], pos: int, message: descriptor_pb2.DescriptorProto) -> int:
    message.name = tokens[pos + 1]
    pos = _expect(tokens, pos + 2, "{")
    while tokens[pos] != "}":
        field = message.field.add()
        if tokens[pos] == "map":  # map<K, V> name = N; -> a repeated NameEntry {K key = 1; V value = 2}
            key, value, name, number = tokens[pos + 2], tokens[pos + 4], tokens[pos + 6], tokens[pos + 8]
            entry = message.nested_type.add(name=_camel(name) + "Entry")
            entry.options.map_entry = True
            for i, (fname, ftype) in enumerate((("key", key), ("value", value)), 1):
                _field(entry.field.add(), fname, ftype, i, descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
            _field(field, name, f"{message.name}.{entry.name}", int(number), descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED)
            pos = _expect(tokens, pos + 9, ";")
            continue
        label = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
        if tokens[pos] == "repeated":
            label, pos = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED, pos + 1
        ftype, name = tokens[pos], tokens[pos + 1]
        pos = _expect(tokens, pos + 2, "=")
        _field(field, name, ftype, int(tokens[pos]), label)
        pos = _expect(tokens, pos + 1, ";")
    return pos + 1


def _field(field: descriptor_pb2.FieldDescriptorProto, name: str, ftype: str, number: int, label: int) -> None:
    field.name, field.number, field.label, field.json_name = name, number, label, _json_name(name)
    if ftype in _SCALARS:
        field.type = _SCALARS[ftype]
    else:
        field.type_name = ftype  # resolved to a message or an enum once the file is read (_resolve)


def _enum(tokens: list[str], pos: int, enum: descriptor_pb2.EnumDescriptorProto) -> int:
    enum.name = tokens[pos + 1]
    pos = _expect(tokens, pos + 2, "{")
    while tokens[pos] != "}":
        enum.value.add(name=tokens[pos], number=int(tokens[pos + 2]))
        pos = _expect(tokens, pos + 3, ";")
    return pos + 1


def _service(tokens: list[str], pos: int, service: descriptor_pb2.ServiceDescriptorProto) -> int:
    service.name = tokens[pos + 1]
    pos = _expect(tokens, pos + 2, "{")
    while tokens[pos] != "}":
        if tokens[pos] != "rpc":
            _fail(f"unexpected {tokens[pos]!r} in service {service.name}")
        method = service.method.add(name=tokens[pos + 1], input_type=tokens[pos + 3])
        pos = _expect(tokens, pos + 5, "returns")
        pos = _expect(tokens, pos, "(")
        if tokens[pos] == "stream":
            method.server_streaming, pos = True, pos + 1
        method.output_type = tokens[pos]
        pos = _expect(tokens, pos + 1, ")")
        if tokens[pos] == "{":
            pos = _expect(tokens, pos + 1, "}")
        if pos < len(tokens) and tokens[pos] == ";":
            pos += 1
    return pos + 1


def _resolve(proto: descriptor_pb2.FileDescriptorProto) -> None:
    prefix = f".{proto.package}." if proto.package else "."
    messages = {m.name for m in proto.message_type} | {f"{m.name}.{n.name}" for m in proto.message_type for n in m.nested_type}
    enums = {e.name for e in proto.enum_type}
    for message in list(proto.message_type) + [n for m in proto.message_type for n in m.nested_type]:
        for field in message.field:
            if field.type_name and not field.type_name.startswith("."):
                if field.type_name in messages:
                    field.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
                elif field.type_name in enums:
                    field.type = descriptor_pb2.FieldDescriptorProto.TYPE_ENUM
                else:
                    _fail(f"unknown type {field.type_name!r} of {message.name}.{field.name}")
                field.type_name = prefix + field.type_name
    for service in proto.service:
        for method in service.method:
            for attr in ("input_type", "output_type"):
                if getattr(method, attr) not in messages:
                    _fail(f"unknown message {getattr(method, attr)!r} of {service.name}.{method.name}")
                setattr(method, attr, prefix + getattr(method, attr))


def _build(proto: descriptor_pb2.FileDescriptorProto) -> Api:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(proto.SerializeToString())  # in every protobuf release since 3.x
    file = pool.FindFileByName(proto.name)
    messages = {name: _message_class(desc) for name, desc in file.message_types_by_name.items()}
    services = {}
    for service in file.services_by_name.values():
        services[service.full_name] = tuple(
            Method(m.name, _message_class(m.input_type), _message_class(m.output_type), bool(m.server_streaming)) for m in service.methods
        )
    return Api(proto.package, messages, services)


def _message_class(desc: Any) -> Any:
    if hasattr(message_factory, "GetMessageClass"):  # protobuf 4.21+
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(desc.file.pool).GetPrototype(desc)  # Debian 12's 3.21
