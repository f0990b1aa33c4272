// defines: longhaul._C's codec bindings — Codec (a parsed chain), Packet (its bytes, shared with Python through the
// buffer protocol), StreamState, inspect and decode_into. longhaul.codecs wraps them for torch tensors.
//
// No torch header here: tensors arrive as (data pointer, shape, dtype name) from longhaul/codecs.py, which checks
// device and contiguity and keeps the tensor alive for the call. Every check on user input is repeated here, so a
// direct caller of _C gets a ValueError, not an abort (except for a pointer that does not hold the shape: that one
// is trusted).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cereal/archives/binary.hpp>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>

#include "compress/codec_chain.h"
#include "core/role.h"

namespace lh::py {
namespace {

namespace pb = pybind11;
using compress::CodecChain;
using compress::Packet;

// invalid argument and corrupt bytes are the caller's to fix (ValueError); the rest is RuntimeError.
[[noreturn]] void throw_status(const Status& s) {
  if (s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kCorrupt) throw pb::value_error(s.message());
  throw std::runtime_error(std::string(status_code_name(s.code())) + ": " + s.message());
}

void check(const Status& s) {
  if (!s.ok()) throw_status(s);
}

template <class T>
T value_or_raise(Result<T> r) {
  if (!r.ok()) throw_status(r.status());
  return std::move(r).value();
}

DType parse_dtype(const std::string& name) {
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  if (name == "f16") return DType::f16;
  throw pb::value_error("dtype '" + name + "': codecs take f32, bf16 or f16");
}

// A shape from Python: at most kMaxNdim dims, none negative, numel within int64.
Shape checked_shape(const Shape& shape) {
  if (shape.size() > static_cast<size_t>(compress::kMaxNdim))
    throw pb::value_error("shape " + shape_string(shape) + " has " + std::to_string(shape.size()) +
                          " dims, packets carry at most " + std::to_string(compress::kMaxNdim));
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) throw pb::value_error("shape " + shape_string(shape) + " has a negative dimension");
    if (d != 0 && numel > std::numeric_limits<int64_t>::max() / 4 / d)
      throw pb::value_error("shape " + shape_string(shape) + " is too large");
    numel *= d;
  }
  return shape;
}

// A tensor over memory the Python caller owns (a torch tensor's data_ptr()), CPU only.
Tensor borrowed(uintptr_t ptr, const Shape& shape, const std::string& dtype) {
  const Shape s = checked_shape(shape);
  const DType dt = parse_dtype(dtype);
  if (ptr == 0 && shape_numel(s) > 0)
    throw pb::value_error("null data pointer for a tensor of shape " + shape_string(s));
  return Tensor::borrow(reinterpret_cast<void*>(ptr), s, dt, Device::cpu);
}

// The bytes of any object with the buffer protocol (bytes, bytearray, memoryview, Packet, a numpy array), as one
// C-contiguous block held for the life of this object (so a bytearray cannot be resized under a decode).
class ByteView {
 public:
  explicit ByteView(const pb::object& obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_SIMPLE) != 0) throw pb::error_already_set();
  }
  ~ByteView() { PyBuffer_Release(&view_); }
  ByteView(const ByteView&) = delete;
  ByteView& operator=(const ByteView&) = delete;
  const uint8_t* data() const { return static_cast<const uint8_t*>(view_.buf); }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
};

// A StreamState with a lock: the GIL is released while a codec updates it, so two Python threads sharing one stream
// take turns instead of racing.
struct PyStreamState {
  compress::StreamState st;
  std::mutex mu;
  explicit PyStreamState(compress::StreamState s) : st(std::move(s)) {}
};

Role parse_stream_role(const std::string& name) {
  Role role = value_or_raise(parse_role(name));
  if (static_cast<int>(role) >= kNumCodecRoles)
    throw pb::value_error("role '" + name + "' cannot carry a codec stream (a packet names act, act_grad, grad or tp)");
  return role;
}

// Runs f(state) without the GIL, on `state` or, when it is None, on a fresh stream of `role`.
template <class F>
Status with_state(PyStreamState* state, Role role, F&& f) {
  pb::gil_scoped_release nogil;
  if (!state) {
    compress::StreamState fresh(role);
    return f(fresh);
  }
  std::lock_guard<std::mutex> lock(state->mu);
  return f(state->st);
}

Packet encode(const CodecChain& chain, uintptr_t ptr, const Shape& shape, const std::string& dtype, PyStreamState* st) {
  const Tensor x = borrowed(ptr, shape, dtype);
  Packet p;
  check(with_state(st, Role::kActivation, [&](compress::StreamState& s) { return chain.encode(x, s, &p); }));
  return p;
}

void decode_into(const pb::object& buffer, uintptr_t ptr, const Shape& shape, const std::string& dtype,
                 PyStreamState* st, bool verify_hash) {
  compress::DecodeOptions opts;
  opts.limits.verify_hash = verify_hash;
  const ByteView bytes(buffer);
  const Tensor out = borrowed(ptr, shape, dtype);
  // Without a state, decode as the packet's own stream (a bad role byte is reported by the decoder).
  Role role = Role::kActivation;
  if (bytes.size() > 9 && bytes.data()[9] < kNumCodecRoles) role = static_cast<Role>(bytes.data()[9]);
  check(with_state(st, role, [&](compress::StreamState& s) -> Status {
    Tensor result = out;
    LH_RETURN_IF_ERROR(compress::decode_packet(bytes.data(), bytes.size(), s, &result, opts));
    // The decoder writes into a defined output in place; should a stage hand back another tensor, copy it over.
    if (result.raw_data() != out.raw_data() && out.nbytes() > 0)
      return copy_bytes(out.raw_data(), Device::cpu, result.raw_data(), result.device(), out.nbytes());
    return Status::Ok();
  }));
}

pb::tuple inspect(const pb::object& buffer, bool verify_hash) {
  const ByteView bytes(buffer);
  compress::WireLimits limits;
  limits.verify_hash = verify_hash;
  const compress::PacketInfo info = value_or_raise([&] {
    pb::gil_scoped_release nogil;  // the hash of a large packet takes a while
    return compress::inspect_packet(bytes.data(), bytes.size(), limits);
  }());
  const compress::PacketHeader& h = info.header;
  return pb::make_tuple(h.shape, dtype_name(h.dtype), info.raw_bytes, info.wire_bytes, compress::codec_name(h.codec));
}

// Header of a packet this process made (no hash check): for Packet's properties.
compress::PacketInfo own_info(const Packet& p) {
  compress::WireLimits limits;
  limits.verify_hash = false;
  return value_or_raise(compress::inspect_packet(p.bytes.data(), p.size(), limits));
}

pb::bytes state_to_bytes(PyStreamState& s) {
  std::ostringstream os;
  {
    pb::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(s.mu);
    cereal::BinaryOutputArchive ar(os);
    ar(s.st);
  }
  const std::string b = os.str();
  return pb::bytes(b);
}

std::unique_ptr<PyStreamState> state_from_bytes(const pb::bytes& data) {
  std::istringstream is{static_cast<std::string>(data)};
  compress::StreamState st;
  try {
    cereal::BinaryInputArchive ar(is);
    ar(st);
  } catch (const std::exception& e) {
    throw pb::value_error(std::string("StreamState.from_bytes: not the bytes of StreamState.to_bytes (") + e.what() +
                          ")");
  }
  return std::make_unique<PyStreamState>(std::move(st));
}

void bind_packet(pb::module_& m) {
  pb::class_<Packet>(m, "Packet", pb::buffer_protocol(),
                     "One encoded tensor. Its bytes are shared (not copied) through the buffer protocol, writable so "
                     "that torch.frombuffer(p, dtype=torch.uint8) takes them without a warning (a changed byte fails "
                     "the checksum); memoryview(p) views them too, bytes(p) copies them.")
      .def_buffer([](Packet& p) {
        return pb::buffer_info(p.bytes.data(), 1, pb::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<pb::ssize_t>(p.size())}, {pb::ssize_t{1}});
      })
      .def("__len__", &Packet::size)
      .def("__bytes__",
           [](const Packet& p) { return pb::bytes(reinterpret_cast<const char*>(p.bytes.data()), p.size()); })
      .def_property_readonly(
          "raw_bytes", [](const Packet& p) { return own_info(p).raw_bytes; },
          "What an uncompressed fp32 send of the tensor would cost: numel * 4.")
      .def_property_readonly(
          "wire_bytes", [](const Packet& p) { return p.size(); }, "The packet's size in bytes.")
      .def_property_readonly("shape", [](const Packet& p) { return own_info(p).header.shape; })
      .def_property_readonly("dtype", [](const Packet& p) { return dtype_name(own_info(p).header.dtype); })
      .def_property_readonly("codec", [](const Packet& p) { return compress::codec_name(own_info(p).header.codec); })
      .def("__repr__", [](const Packet& p) {
        const compress::PacketInfo i = own_info(p);
        return std::string("<longhaul Packet ") + compress::codec_name(i.header.codec) + " " +
               dtype_name(i.header.dtype) + shape_string(i.header.shape) + ", " + std::to_string(i.wire_bytes) +
               " bytes>";
      });
}

void bind_state(pb::module_& m) {
  pb::class_<PyStreamState>(m, "StreamState",
                            "What one stream remembers between packets (ef residuals, PowerSGD warm starts, the "
                            "packet counter). One per stream end; encoder and decoder each keep their own.")
      .def(pb::init([](const std::string& role, uint64_t seed) {
             return std::make_unique<PyStreamState>(compress::StreamState(parse_stream_role(role), seed));
           }),
           pb::arg("role") = "act", pb::arg("seed") = 0)
      .def_property_readonly("role", [](const PyStreamState& s) { return role_name(s.st.role()); })
      .def_property_readonly("seed", [](const PyStreamState& s) { return s.st.seed(); })
      .def_property_readonly("packets_encoded", [](const PyStreamState& s) { return s.st.packets_encoded(); })
      .def(
          "reset",
          [](PyStreamState& s) {
            pb::gil_scoped_release nogil;
            std::lock_guard<std::mutex> lock(s.mu);
            s.st.reset();
          },
          "Drops everything learnt (residuals, warm starts).")
      .def("to_bytes", &state_to_bytes, "The state as bytes (cereal binary), for StreamState.from_bytes.")
      .def_static("from_bytes", &state_from_bytes, pb::arg("data"),
                  "A state from StreamState.to_bytes (trusted bytes, like a checkpoint's).")
      .def("__repr__", [](const PyStreamState& s) {
        return std::string("<longhaul StreamState role=") + role_name(s.st.role()) +
               " seed=" + std::to_string(s.st.seed()) + " packets_encoded=" + std::to_string(s.st.packets_encoded()) +
               ">";
      });
}

void bind_codec(pb::module_& m) {
  pb::class_<CodecChain>(m, "Codec", "A parsed codec chain, e.g. 'ef+topk:ratio=0.01+int4' or 'preset:balanced'.")
      .def(pb::init([](const std::string& spec) { return value_or_raise(compress::parse_codec_spec(spec)); }),
           pb::arg("spec"))
      .def_property_readonly("spec", &CodecChain::spec, "The canonical spec (every option written out).")
      .def(
          "packet_bytes",
          [](const CodecChain& c, const Shape& shape) { return value_or_raise(c.packet_bytes(checked_shape(shape))); },
          pb::arg("shape"), "Exact packet size for a tensor of this shape; with a final zstd, the largest it can be.")
      .def("encode", &encode, pb::arg("ptr"), pb::arg("shape"), pb::arg("dtype"), pb::arg("state") = pb::none(),
           "Encodes the contiguous CPU tensor at ptr (shape, dtype 'f32'|'bf16'|'f16') into a new Packet.")
      .def("__repr__", [](const CodecChain& c) { return "<longhaul Codec " + c.spec() + ">"; });
}

}  // namespace

void bind_codecs(pybind11::module_& m) {
  bind_packet(m);
  bind_state(m);
  bind_codec(m);
  m.def("inspect", &inspect, pb::arg("buffer"), pb::arg("verify_hash") = true,
        "(shape, dtype, raw_bytes, wire_bytes, codec) of a packet held by any buffer; ValueError names a bad field.");
  m.def("decode_into", &decode_into, pb::arg("buffer"), pb::arg("ptr"), pb::arg("shape"), pb::arg("dtype"),
        pb::arg("state") = pb::none(), pb::kw_only(), pb::arg("verify_hash") = true,
        "Decodes the packet in buffer into the contiguous CPU tensor at ptr, whose shape and dtype must be the "
        "packet's. Without a state, a fresh stream of the packet's role. verify_hash=False is for the fuzz tests "
        "(the parser's checks without the checksum's).");
}

}  // namespace lh::py
