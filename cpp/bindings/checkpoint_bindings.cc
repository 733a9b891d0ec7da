// dsv41rt._core.Checkpoint: zero-copy numpy views into memory-mapped safetensors files.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/safetensors.h"
#include "core/status.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {
namespace {

// Packed fp4 and raw scale codes are exposed as integers; decoding is explicit (decode()).
nb::dlpack::dtype numpy_dtype(DType d) {
  switch (d) {
    case DType::kF32:
      return nb::dtype<float>();
    case DType::kBF16:
    case DType::kF16:
      return nb::dtype<uint16_t>();
    case DType::kFP8E4M3:
    case DType::kE8M0:
    case DType::kU8:
    case DType::kFP4E2M1:
      return nb::dtype<uint8_t>();
    case DType::kI8:
      return nb::dtype<int8_t>();
    case DType::kI32:
      return nb::dtype<int32_t>();
    case DType::kI64:
      return nb::dtype<int64_t>();
  }
  DSV41RT_THROW_CODE(kInternal, "invalid DType ", static_cast<int>(d));
}

nb::list shape_list(const std::vector<int64_t>& shape) {
  nb::list out;
  for (int64_t d : shape) out.append(d);
  return out;
}

}  // namespace

void register_checkpoint(nb::module_& m) {
  m.def(
      "safetensors_dtype_size",
      [](const std::string& name) { return bytes_for(dtype_from_safetensors(name), 1); },
      nb::arg("dtype"),
      "Bytes per element of a safetensors dtype string (F32 -> 4, I8 -> 1, ...).");
  nb::class_<Checkpoint>(m, "Checkpoint",
                         "A safetensors checkpoint: a .safetensors file, an index.json, or a "
                         "directory (single or sharded). Headers are fully validated on open.")
      .def(nb::init<const std::string&>(), nb::arg("path"))
      .def_prop_ro("path", &Checkpoint::path)
      .def("names", &Checkpoint::names, "Sorted tensor names.")
      .def("files", &Checkpoint::files, "Sorted paths of the data files.")
      .def(
          "metadata",
          [](const Checkpoint& ck) {
            nb::dict d;
            for (const auto& [k, v] : ck.metadata()) d[k.c_str()] = v;
            return d;
          },
          "Merged __metadata__ string map.")
      .def(
          "info",
          [](const Checkpoint& ck, const std::string& name) {
            const TensorInfo& t = ck.info(name);
            nb::dict d;
            d["dtype"] = safetensors_name(t.dtype);
            d["shape"] = shape_list(t.shape);
            d["file"] = t.file;
            d["nbytes"] = t.nbytes;
            return d;
          },
          nb::arg("name"), "dict(dtype=safetensors dtype string, shape, file, nbytes).")
      .def(
          "all_info",
          [](const Checkpoint& ck) {
            nb::dict d;
            for (const std::string& name : ck.names()) {
              const TensorInfo& t = ck.info(name);
              d[name.c_str()] = nb::make_tuple(safetensors_name(t.dtype), shape_list(t.shape));
            }
            return d;
          },
          "{name: (dtype string, shape list)} for every tensor.")
      .def(
          "array",
          [](nb::handle self, const std::string& name) {
            const Checkpoint& ck = nb::cast<const Checkpoint&>(self);
            const TensorInfo& t = ck.info(name);
            std::vector<size_t> shape(t.shape.begin(), t.shape.end());
            // The array holds a reference to the Checkpoint object (owner), so the mapping
            // outlives every view. Read-only: the mapping is PROT_READ.
            return nb::ndarray<nb::numpy, nb::ro>(ck.tensor_data(name), shape.size(), shape.data(),
                                                  self, nullptr, numpy_dtype(t.dtype));
          },
          nb::arg("name"),
          "Zero-copy read-only numpy view of a tensor (F32->float32, BF16/F16->uint16, "
          "F8_E4M3/F8_E8M0/U8->uint8, I8->int8, I32->int32, I64->int64).")
      .def("__len__", &Checkpoint::size)
      .def("__contains__",
           [](const Checkpoint& ck, const std::string& name) { return ck.contains(name); })
      .def("__repr__", [](const Checkpoint& ck) {
        return "<dsv41rt._core.Checkpoint '" + ck.path() + "' with " + std::to_string(ck.size()) +
               " tensors in " + std::to_string(ck.files().size()) + " file(s)>";
      });
}

}  // namespace dsv41rt::bindings
