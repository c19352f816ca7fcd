// gradmesh._gradmesh: the C++ SDK (gradmesh/client.h) for Python.
//
// A thin layer: the classes and calls of client.h under Python names, with
// numpy arrays that are views of a bucket's shared memory (zero copies), the
// GIL released wherever a call may block, and every non-OK absl::Status
// raised as gradmesh.GradmeshError carrying the status code. The Pythonic
// API (gradmesh.init, allreduce, gradmesh.torch) is in the package's .py
// files, over this module.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradmesh/client.h"

namespace py = pybind11;

namespace gradmesh::python {
namespace {

// A non-OK status on its way to Python (translated in the module init).
struct StatusError {
  absl::Status status;
};

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError{status};
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> result) {
  ThrowIfError(result.status());
  return *std::move(result);
}

// A numpy view of `data` that keeps `owner` (the Python TensorSet) alive.
template <typename T>
py::array_t<T> View(T* data, size_t size, py::handle owner, bool writable) {
  py::array_t<T> array({size}, {sizeof(T)}, data, owner);
  if (!writable) {
    py::detail::array_proxy(array.ptr())->flags &=
        ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  }
  return array;
}

ReduceOp ParseOp(const std::string& op) {
  if (op == "sum") return ReduceOp::kSum;
  if (op == "mean") return ReduceOp::kMean;
  throw StatusError{absl::InvalidArgumentError(
      "op must be 'sum' or 'mean', not '" + op + "'")};
}

Fusion ParseFusion(const std::string& fusion) {
  if (fusion == "per_tensor") return Fusion::kPerTensorQuota;
  if (fusion == "after_fusion") return Fusion::kAfterFusion;
  throw StatusError{absl::InvalidArgumentError(
      "fusion must be 'per_tensor' or 'after_fusion', not '" + fusion + "'")};
}

// The SDK objects as Python holds them: a TensorSet keeps its Client alive
// (it unregisters through it), a Handle keeps its TensorSet alive (the
// worker writes there until the handle is waited for).
using ClientPtr = std::shared_ptr<Client>;

struct PyTensorSet {
  ClientPtr client;
  std::unique_ptr<TensorSet> set;
};

struct PyHandle {
  std::shared_ptr<PyTensorSet> set;
  std::mutex mu;  // one wait() at a time
  Handle handle;
};

// Deletes `object` without holding the GIL: the SDK's destructors block
// (a TensorSet unregisters, a Client waits for its calls in flight).
template <typename T>
std::shared_ptr<T> ReleasingGil(T* object) {
  return std::shared_ptr<T>(object, [](T* p) {
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      delete p;
    } else {
      delete p;
    }
  });
}

void BindTypes(py::module_& m) {
  py::class_<ReduceInfo>(m, "ReduceInfo",
                         "What one all-reduce did (client.h ReduceInfo).")
      .def_readonly("nonzeros", &ReduceInfo::nonzeros)
      .def_readonly("epoch", &ReduceInfo::epoch)
      .def_readonly("rank", &ReduceInfo::rank)
      .def_readonly("world_size", &ReduceInfo::world_size)
      .def_readonly("algorithm", &ReduceInfo::algorithm)
      .def_readonly("teams", &ReduceInfo::teams)
      .def_readonly("seconds", &ReduceInfo::seconds)
      .def_readonly("wait_seconds", &ReduceInfo::wait_seconds)
      .def_readonly("rounds", &ReduceInfo::rounds)
      .def_readonly("bytes_sent", &ReduceInfo::bytes_sent)
      .def_readonly("bytes_received", &ReduceInfo::bytes_received)
      .def_readonly("tensors", &ReduceInfo::tensors)
      .def_readonly("tensors_missing", &ReduceInfo::tensors_missing)
      .def("__repr__", [](const ReduceInfo& r) {
        return "ReduceInfo(algorithm='" + r.algorithm +
               "', nonzeros=" + std::to_string(r.nonzeros) +
               ", bytes_sent=" + std::to_string(r.bytes_sent) +
               ", tensors_missing=" + std::to_string(r.tensors_missing) + ")";
      });

  py::class_<Plan>(m, "Plan", "The worker's view and plan (client.h Plan).")
      .def_readonly("epoch", &Plan::epoch)
      .def_readonly("rank", &Plan::rank)
      .def_readonly("world_size", &Plan::world_size)
      .def_readonly("algorithm", &Plan::algorithm)
      .def_readonly("density", &Plan::density)
      .def_readonly("teams", &Plan::teams)
      .def_readonly("encoding", &Plan::encoding)
      .def_readonly("autotuning", &Plan::autotuning)
      .def_readonly("exact_below", &Plan::exact_below)
      .def_readonly("dense_sizes", &Plan::dense_sizes)
      .def_readonly("warmup_steps", &Plan::warmup_steps)
      .def_readonly("fusion", &Plan::fusion)
      .def_readonly("note", &Plan::note);
}

void BindTensorSet(py::module_& m) {
  py::class_<PyTensorSet, std::shared_ptr<PyTensorSet>>(
      m, "TensorSet",
      "A registered bucket: its tensors fused in shared memory. The arrays "
      "it hands out are views of that memory and keep it alive.")
      .def_property_readonly(
          "bucket", [](const PyTensorSet& s) { return s.set->bucket(); })
      .def_property_readonly("size",
                             [](const PyTensorSet& s) { return s.set->size(); })
      .def_property_readonly("tensors",
                             [](const PyTensorSet& s) {
                               std::vector<std::pair<std::string, uint64_t>> t;
                               for (const TensorSpec& spec : s.set->tensors()) {
                                 t.emplace_back(spec.name, spec.size);
                               }
                               return t;
                             })
      .def(
          "values",
          [](py::object self) {
            auto& s = self.cast<PyTensorSet&>();
            absl::Span<float> v = s.set->values();
            return View(v.data(), v.size(), self, true);
          },
          "Every tensor fused (float32, writable): the gradient goes here "
          "and the dense result comes back here.")
      .def("offset",
           [](const PyTensorSet& s, size_t i) {
             if (i >= s.set->tensors().size()) throw py::index_error();
             return s.set->offset(i);
           })
      .def("sparse_indices",
           [](py::object self, uint64_t nonzeros) {
             auto& s = self.cast<PyTensorSet&>();
             if (nonzeros > s.set->size()) throw py::index_error();
             absl::Span<const uint32_t> v = s.set->sparse_indices(nonzeros);
             return View(const_cast<uint32_t*>(v.data()), v.size(), self,
                         false);
           })
      .def("sparse_values",
           [](py::object self, uint64_t nonzeros) {
             auto& s = self.cast<PyTensorSet&>();
             if (nonzeros > s.set->size()) throw py::index_error();
             absl::Span<const float> v = s.set->sparse_values(nonzeros);
             return View(const_cast<float*>(v.data()), v.size(), self, false);
           })
      .def("residual", [](py::object self) {
        auto& s = self.cast<PyTensorSet&>();
        absl::Span<const float> v = s.set->residual();
        return View(const_cast<float*>(v.data()), v.size(), self, false);
      });
}

void BindHandle(py::module_& m) {
  py::class_<PyHandle, std::shared_ptr<PyHandle>>(
      m, "Handle", "An all-reduce in flight: wait() once for its outcome.")
      .def(
          "wait",
          [](PyHandle& h) {
            absl::StatusOr<ReduceInfo> info;
            {
              py::gil_scoped_release release;
              std::lock_guard<std::mutex> lock(h.mu);
              info = h.handle.Wait();
            }
            return ValueOrThrow(std::move(info));
          },
          "Blocks until the operation ends; returns its ReduceInfo or raises "
          "GradmeshError.")
      .def("done", [](const PyHandle& h) { return h.handle.Done(); });
}

// `call()` with the GIL released: it blocks on the worker.
template <typename Call>
auto WithoutGil(Call call) {
  py::gil_scoped_release release;
  return call();
}

// The client's calls besides connecting, registering and reducing.
void BindClientCalls(py::class_<Client, ClientPtr>& cls) {
  cls.def(
         "broadcast",
         [](Client& c, PyTensorSet& set, int root) {
           ThrowIfError(
               WithoutGil([&] { return c.Broadcast(*set.set, root); }));
         },
         py::arg("set"), py::arg("root"))
      .def(
          "save_residual",
          [](Client& c, PyTensorSet& set) {
            ThrowIfError(WithoutGil([&] { return c.SaveResidual(*set.set); }));
          },
          py::arg("set"),
          "Copies the worker's residual of the set into set.residual().")
      .def(
          "load_residual",
          [](Client& c, PyTensorSet& set,
             py::array_t<float, py::array::c_style | py::array::forcecast>
                 residual) {
            if (residual.ndim() != 1) {
              throw py::value_error("gradmesh: a residual is one-dimensional");
            }
            const absl::Span<const float> values(residual.data(),
                                                 residual.size());
            ThrowIfError(
                WithoutGil([&] { return c.LoadResidual(*set.set, values); }));
          },
          py::arg("set"), py::arg("residual"),
          "Replaces the worker's residual of the set (size values, finite).")
      .def("barrier",
           [](Client& c) {
             ThrowIfError(WithoutGil([&] { return c.Barrier(); }));
           })
      .def("plan", [](Client& c) {
        return ValueOrThrow(WithoutGil([&] { return c.GetPlan(); }));
      });
}

// Client.register: a bucket of (name, size) tensors.
std::shared_ptr<PyTensorSet> Register(
    ClientPtr client, const std::string& bucket,
    const std::vector<std::pair<std::string, uint64_t>>& tensors,
    const std::string& fusion, bool exact, uint32_t exact_tensors) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, size] : tensors) specs.push_back({name, size});
  const RegisterOptions options{.fusion = ParseFusion(fusion),
                                .exact = exact,
                                .exact_tensors = exact_tensors};
  auto set =
      WithoutGil([&] { return client->Register(bucket, specs, options); });
  return ReleasingGil(new PyTensorSet{client, ValueOrThrow(std::move(set))});
}

void BindClient(py::module_& m) {
  py::class_<Client, ClientPtr> cls(
      m, "Client", "A connection to this node's worker daemon.");
  cls.def_static(
         "connect",
         [](const std::string& worker, const std::string& job,
            double timeout_seconds) {
           ClientOptions options{.worker = worker, .job = job};
           options.timeout = absl::Seconds(timeout_seconds);
           auto client = WithoutGil([&] { return Client::Connect(options); });
           return ReleasingGil(ValueOrThrow(std::move(client)).release());
         },
         py::arg("worker") = "", py::arg("job") = "",
         py::arg("timeout") = 300.0,
         "Connects (worker and job default to $GRADMESH_WORKER and "
         "$GRADMESH_JOB; over TCP the token is $GRADMESH_TOKEN) and waits "
         "until the worker is in a view.")
      .def("register", &Register, py::arg("bucket"), py::arg("tensors"),
           py::arg("fusion") = "per_tensor", py::arg("exact") = false,
           py::arg("exact_tensors") = 0,
           "Registers a bucket of (name, size) float32 tensors; every process "
           "registers the same buckets in the same order. exact: always "
           "summed exactly (dense), whatever the plan; exact_tensors: the "
           "last this many tensors summed exactly, in the bucket's own "
           "operation.")
      .def(
          "allreduce_async",
          [](ClientPtr client, std::shared_ptr<PyTensorSet> set, uint64_t step,
             const std::string& op, bool sparse, bool return_residual) {
            const AllReduceOptions options{
                .op = ParseOp(op),
                .layout = sparse ? ResultLayout::kSparse : ResultLayout::kDense,
                .return_residual = return_residual};
            auto handle = std::make_shared<PyHandle>();
            handle->set = set;
            handle->handle = client->AllReduceAsync(*set->set, step, options);
            return handle;
          },
          py::arg("set"), py::arg("step"), py::arg("op") = "sum",
          py::arg("sparse") = false, py::arg("return_residual") = false,
          "Starts summing the set's values for `step`; the memory is the "
          "worker's until the returned Handle is waited for.")
      .def_property_readonly("rank", &Client::rank)
      .def_property_readonly("size", &Client::size)
      .def_property_readonly("job", &Client::job);
  BindClientCalls(cls);
}

}  // namespace
}  // namespace gradmesh::python

PYBIND11_MODULE(_gradmesh, m) {
  using gradmesh::python::StatusError;
  m.doc() = "gradmesh's C++ SDK; use the gradmesh package instead.";
  // GradmeshError(message) with .code: the status code's name ("ABORTED").
  static py::exception<StatusError> error(m, "GradmeshError",
                                          PyExc_RuntimeError);
  // WorkerGoneError(GradmeshError): this process's worker is gone
  // (gradmesh::IsWorkerGone); the trainer should stop.
  static py::exception<StatusError> gone(m, "WorkerGoneError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const std::string code = absl::StatusCodeToString(e.status.code());
      const py::handle type =
          gradmesh::IsWorkerGone(e.status) ? gone.ptr() : error.ptr();
      py::object exc = type(std::string(e.status.message()));
      exc.attr("code") = code;
      PyErr_SetObject(type.ptr(), exc.ptr());
    }
  });
  gradmesh::python::BindTypes(m);
  gradmesh::python::BindTensorSet(m);
  gradmesh::python::BindHandle(m);
  gradmesh::python::BindClient(m);
}
