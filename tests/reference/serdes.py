"""The schema registry's reference serializers (Confluent's Python client: protobuf's own
runtime, the `jsonschema` validator) as an independent side for onceflow's Protobuf and JSON
Schema codecs: values are written and read here, never by onceflow.

    serdes.py encode protobuf    REGISTRY TOPIC PROTO_DIR PROTO_FILE MESSAGE  < values > wire
    serdes.py decode protobuf    REGISTRY TOPIC PROTO_DIR PROTO_FILE MESSAGE  < wire > values
    serdes.py encode json_schema REGISTRY TOPIC SCHEMA_FILE                   < values > wire
    serdes.py decode json_schema REGISTRY TOPIC SCHEMA_FILE                   < wire > values

`values` are JSON lines (protobuf's JSON mapping, field names as in the .proto); `wire` is one
value a line in hex, in the Confluent wire format. Protobuf messages are compiled from the
.proto with grpc_tools' protoc (imports resolved in PROTO_DIR). Decoded, each line is
{"value": ..., "schema_id": ..., "schema_type": ...}, the type as the registry has the id the
value carries; a value that cannot be decoded is {"error": "..."}.
"""

import importlib
import json
import pathlib
import subprocess
import sys
import tempfile

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext


def message_class(proto_dir, proto_file, message):
    out = tempfile.mkdtemp(prefix="serdes-")
    # Every file of the directory, so that the ones proto_file imports have their modules.
    files = [str(p.relative_to(proto_dir)) for p in pathlib.Path(proto_dir).rglob("*.proto")]
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{proto_dir}", f"--python_out={out}", *files],
        check=True,
    )
    sys.path.insert(0, out)
    module = importlib.import_module(proto_file[: -len(".proto")].replace("/", ".") + "_pb2")
    cls = module
    for part in message.split(".")[len(module.DESCRIPTOR.package.split(".")) if module.DESCRIPTOR.package else 0 :]:
        cls = getattr(cls, part)
    return cls


def main():
    action, fmt, registry, topic = sys.argv[1:5]
    client = SchemaRegistryClient({"url": registry})
    ctx = SerializationContext(topic, MessageField.VALUE)
    if fmt == "protobuf":
        from google.protobuf import json_format
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer

        cls = message_class(*sys.argv[5:8])
        if action == "encode":
            ser = ProtobufSerializer(cls, client)

            def encode(v):
                return ser(json_format.ParseDict(v, cls()), ctx)
        else:
            de = ProtobufDeserializer(cls)

            def decode(b):
                return json_format.MessageToDict(
                    de(b, ctx),
                    preserving_proto_field_name=True,
                    always_print_fields_with_no_presence=True,
                )
    else:
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer

        with open(sys.argv[5]) as f:
            schema = f.read()
        if action == "encode":
            ser = JSONSerializer(schema, client)

            def encode(v):
                return ser(v, ctx)
        else:
            # Checks each value against the schema, as a consumer that validates does.
            de = JSONDeserializer(schema)

            def decode(b):
                return de(b, ctx)

    types = {}
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        if action == "encode":
            print(encode(json.loads(line)).hex())
        else:
            try:
                wire = bytes.fromhex(line)
                value = decode(wire)
                schema_id = int.from_bytes(wire[1:5], "big")
                if schema_id not in types:
                    types[schema_id] = client.get_schema(schema_id).schema_type
                out = {"value": value, "schema_id": schema_id, "schema_type": types[schema_id]}
                print(json.dumps(out, sort_keys=True))
            except Exception as e:  # a value the reference cannot read: the test names it
                print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
