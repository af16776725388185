"""Run inside a process whose LD_LIBRARY_PATH has TensorRT-RTX's library folder (the ONNX parser
dlopens the unversioned names): for each job of the JSON file argv[1], with TensorRT-RTX's real
builder, print one JSON line of facts for the test to assert on.

- kind v3: load the plugin library into the registry, parse kernel_lens's ONNX, add one
  optimization profile (min/opt/max per input dim), build a serialized engine.
- kind v2: load the library; per plugin, create it through its registered creator with the
  `launch` field, serialize it, deserialize it, serialize again (TensorRT-RTX builds no V2
  plugin into a network)."""

import json
import sys

import numpy as np
import tensorrt_rtx_bindings as trt

logger = trt.Logger(trt.Logger.ERROR)
builder = trt.Builder(logger)  # before load_library, or load errors are silent
registry = trt.get_plugin_registry()


def creators(prefix):
    return sorted(c.name for c in registry.all_creators if c.name.startswith(prefix))


def v3(job):
    registry.load_library(job["library"])
    out = {"creators": creators(job["prefix"])}
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    with open(job["onnx"], "rb") as f:
        out["parsed"] = bool(parser.parse(f.read()))
    out["parse_errors"] = [str(parser.get_error(i)) for i in range(parser.num_errors)]
    out["plugin_layers"] = sum(network.get_layer(i).type == trt.LayerType.PLUGIN_V3
                               for i in range(network.num_layers))
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        t = network.get_input(i)
        dims = job["profile"][t.name]
        profile.set_shape(t.name, *[tuple(d[k] for d in dims) for k in range(3)])
    config.add_optimization_profile(profile)
    engine = builder.build_serialized_network(network, config)
    out["engine_bytes"] = 0 if engine is None else engine.nbytes
    return out


def v2(job):
    registry.load_library(job["library"])
    out = {"creators": creators(job["prefix"]), "round_trips": []}
    for name, launch in job["plugins"]:
        creator = registry.get_creator(name, "1", "kernel_lens")
        fields = trt.PluginFieldCollection([trt.PluginField("launch", np.array([launch], dtype=np.int32),
                                                            trt.PluginFieldType.INT32)])
        plugin = creator.create_plugin(name, fields)
        blob = bytes(plugin.serialize())
        again = creator.deserialize_plugin(name, blob)
        out["round_trips"].append([name, plugin.plugin_type, again.plugin_type, blob.hex(),
                                   bytes(again.serialize()).hex()])
    return out


for job in json.load(open(sys.argv[1])):
    try:
        result = v3(job) if job["kind"] == "v3" else v2(job)
    except Exception as exc:  # report per job: the test names the model
        result = {"exception": f"{type(exc).__name__}: {exc}"}
    print(json.dumps({"stem": job["stem"], "kind": job["kind"], **result}), flush=True)
