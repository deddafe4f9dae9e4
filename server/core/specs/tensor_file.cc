#include "server/core/specs/tensor_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/specs/zip_archive.h"

namespace fitrun::server {
namespace {

// Bounds for an untrusted file: a dict of tensors pickles to a few hundred bytes per tensor.
constexpr size_t kMaxPickleBytes = size_t{16} << 20;
constexpr size_t kMaxStackDepth = 4096;

absl::Status Invalid(absl::string_view what) { return absl::InvalidArgumentError(what); }

// ---- the pickle --------------------------------------------------------------------------------

// A value the pickle builds. Containers are shared, as Python's are: SETITEMS on a memoized dict
// changes what a later BINGET returns. So a pickle can make cycles (a list appended to itself), and
// values are owned by the Unpickler's arena, not by each other; they live as long as it does.
struct Value {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kGlobal, kTuple, kList, kDict, kPersistent, kCall };
  Kind kind = Kind::kNone;
  int64_t integer = 0;
  double real = 0;
  std::string text;           // a string, or a global as "module.name"
  std::vector<Value*> items;  // tuple and list items; dict keys and values alternating;
                              // persistent: [id]; call: [callable, args]
};
using ValuePtr = Value*;

class Unpickler {
 public:
  explicit Unpickler(absl::string_view bytes) : b_(bytes) {}

  // The top value, valid while this Unpickler lives.
  absl::StatusOr<ValuePtr> Run() {
    while (true) {
      if (at_ >= b_.size()) return Invalid("the pickle ends before its STOP");
      const size_t opcode_at = at_;
      const uint8_t op = static_cast<uint8_t>(b_[at_++]);
      absl::Status s = Step(op);
      if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(s.message(), " (pickle byte ", opcode_at, ")"));
      if (done_) {
        if (stack_.size() != 1) return Invalid("the pickle leaves more than one object");
        return stack_.back();
      }
      if (stack_.size() > kMaxStackDepth) return Invalid("the pickle's stack grows without bound");
    }
  }

 private:
  ValuePtr Make(Value::Kind kind) {
    arena_.push_back(std::make_unique<Value>());
    arena_.back()->kind = kind;
    return arena_.back().get();
  }
  absl::Status Need(size_t n) {
    if (b_.size() - at_ < n) return Invalid("the pickle is truncated");
    return absl::OkStatus();
  }
  uint64_t Little(size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(b_[at_ + i])) << (8 * i);
    at_ += n;
    return v;
  }
  absl::Status Push(ValuePtr v) {
    stack_.push_back(std::move(v));
    return absl::OkStatus();
  }
  absl::StatusOr<ValuePtr> Pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) return Invalid("the pickle's stack underflows");
    ValuePtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  // Everything above the last MARK, which is removed.
  absl::StatusOr<std::vector<ValuePtr>> PopToMark() {
    if (marks_.empty()) return Invalid("the pickle has no MARK to pop to");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<ValuePtr> items(std::make_move_iterator(stack_.begin() + mark), std::make_move_iterator(stack_.end()));
    stack_.resize(mark);
    return items;
  }
  absl::Status PushString(size_t length) {
    if (absl::Status s = Need(length); !s.ok()) return s;
    ValuePtr v = Make(Value::Kind::kString);
    v->text = std::string(b_.substr(at_, length));
    at_ += length;
    return Push(std::move(v));
  }
  absl::Status PushInt(int64_t value) {
    ValuePtr v = Make(Value::Kind::kInt);
    v->integer = value;
    return Push(std::move(v));
  }
  absl::Status Line(std::string* out) {
    const size_t end = b_.find('\n', at_);
    if (end == absl::string_view::npos) return Invalid("the pickle is truncated");
    *out = std::string(b_.substr(at_, end - at_));
    at_ = end + 1;
    return absl::OkStatus();
  }
  absl::Status Memo(uint64_t index) {
    if (stack_.empty()) return Invalid("the pickle memoizes an empty stack");
    if (memo_.size() > kMaxStackDepth * 16 && memo_.count(index) == 0) return Invalid("the pickle's memo grows without bound");
    memo_[index] = stack_.back();
    return absl::OkStatus();
  }
  absl::Status Get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) return Invalid("the pickle refers to a memo entry it never made");
    return Push(it->second);
  }
  absl::Status Tuple(size_t n) {
    if (stack_.size() < n || (!marks_.empty() && stack_.size() - n < marks_.back())) {
      return Invalid("the pickle's stack underflows");
    }
    ValuePtr v = Make(Value::Kind::kTuple);
    v->items.assign(stack_.end() - n, stack_.end());
    stack_.resize(stack_.size() - n);
    return Push(std::move(v));
  }
  // A call of collections.OrderedDict() is an empty dict that SETITEMS fills.
  static bool IsDict(const Value& v) { return v.kind == Value::Kind::kDict; }

  absl::Status SetItems(std::vector<ValuePtr> pairs) {
    if (pairs.size() % 2 != 0) return Invalid("the pickle sets a key without a value");
    absl::StatusOr<ValuePtr> dict = Pop();
    if (!dict.ok()) return dict.status();
    if (!IsDict(**dict)) return Invalid("the pickle sets items on something that is not a dict");
    for (ValuePtr& p : pairs) (*dict)->items.push_back(std::move(p));
    return Push(*std::move(dict));
  }

  // One opcode, by its family; an opcode no family knows is refused.
  absl::Status Step(uint8_t op) {
    for (auto family : {&Unpickler::Framing, &Unpickler::Literal, &Unpickler::Memoized, &Unpickler::GlobalOrCall,
                        &Unpickler::Container}) {
      if (std::optional<absl::Status> done = (this->*family)(op); done.has_value()) return *done;
    }
    return Invalid(absl::StrCat("the pickle uses opcode 0x", absl::Hex(op),
                                ", which a dict of tensors from torch.save does not"));
  }

  // The protocol, frames, the end and marks.
  std::optional<absl::Status> Framing(uint8_t op) {
    switch (op) {
      case 0x80:  // PROTO
        if (absl::Status s = Need(1); !s.ok()) return s;
        ++at_;
        return absl::OkStatus();
      case 0x95:  // FRAME
        if (absl::Status s = Need(8); !s.ok()) return s;
        at_ += 8;
        return absl::OkStatus();
      case '.':  // STOP
        done_ = true;
        return absl::OkStatus();
      case '(':  // MARK
        marks_.push_back(stack_.size());
        if (marks_.size() > kMaxStackDepth) return Invalid("the pickle nests too deep");
        return absl::OkStatus();
      default:
        return std::nullopt;
    }
  }

  // Values written out: empty containers, None, booleans, integers, floats and strings.
  std::optional<absl::Status> Literal(uint8_t op) {
    switch (op) {
      case '}':
        return Push(Make(Value::Kind::kDict));
      case ']':
        return Push(Make(Value::Kind::kList));
      case ')':
        return Push(Make(Value::Kind::kTuple));
      case 'N':
        return Push(Make(Value::Kind::kNone));
      case 0x88:
      case 0x89: {  // NEWTRUE, NEWFALSE
        ValuePtr v = Make(Value::Kind::kBool);
        v->integer = op == 0x88;
        return Push(std::move(v));
      }
      case 'X':  // BINUNICODE
        if (absl::Status s = Need(4); !s.ok()) return s;
        return PushString(Little(4));
      case 0x8c:  // SHORT_BINUNICODE
      case 'U':   // SHORT_BINSTRING
        if (absl::Status s = Need(1); !s.ok()) return s;
        return PushString(Little(1));
      case 'T':  // BINSTRING
        if (absl::Status s = Need(4); !s.ok()) return s;
        return PushString(Little(4));
      case 0x8d:  // BINUNICODE8
        if (absl::Status s = Need(8); !s.ok()) return s;
        return PushString(Little(8));
      case 'K':  // BININT1
        if (absl::Status s = Need(1); !s.ok()) return s;
        return PushInt(static_cast<int64_t>(Little(1)));
      case 'M':  // BININT2
        if (absl::Status s = Need(2); !s.ok()) return s;
        return PushInt(static_cast<int64_t>(Little(2)));
      case 'J':  // BININT
        if (absl::Status s = Need(4); !s.ok()) return s;
        return PushInt(static_cast<int32_t>(Little(4)));
      case 0x8a: {  // LONG1: a little-endian two's complement integer of n bytes
        if (absl::Status s = Need(1); !s.ok()) return s;
        const size_t n = Little(1);
        if (n > 8) return Invalid("the pickle holds an integer beyond 64 bits");
        if (absl::Status s = Need(n); !s.ok()) return s;
        uint64_t raw = Little(n);
        if (n > 0 && n < 8 && (raw >> (8 * n - 1)) & 1) raw |= ~uint64_t{0} << (8 * n);
        return PushInt(static_cast<int64_t>(raw));
      }
      case 'G': {  // BINFLOAT, big-endian
        if (absl::Status s = Need(8); !s.ok()) return s;
        uint64_t raw = 0;
        for (int i = 0; i < 8; ++i) raw = raw << 8 | static_cast<uint8_t>(b_[at_ + i]);
        at_ += 8;
        ValuePtr v = Make(Value::Kind::kFloat);
        std::memcpy(&v->real, &raw, sizeof(raw));
        return Push(std::move(v));
      }
      default:
        return std::nullopt;
    }
  }

  // The memo: values put aside and fetched again by index.
  std::optional<absl::Status> Memoized(uint8_t op) {
    switch (op) {
      case 'q':  // BINPUT
        if (absl::Status s = Need(1); !s.ok()) return s;
        return Memo(Little(1));
      case 'r':  // LONG_BINPUT
        if (absl::Status s = Need(4); !s.ok()) return s;
        return Memo(Little(4));
      case 0x94:  // MEMOIZE
        return Memo(memo_.size());
      case 'h':  // BINGET
        if (absl::Status s = Need(1); !s.ok()) return s;
        return Get(Little(1));
      case 'j':  // LONG_BINGET
        if (absl::Status s = Need(4); !s.ok()) return s;
        return Get(Little(4));
      default:
        return std::nullopt;
    }
  }

  // Globals, persistent ids and calls: recorded, never resolved or made.
  std::optional<absl::Status> GlobalOrCall(uint8_t op) {
    switch (op) {
      case 'c': {  // GLOBAL: "module\nname\n", recorded, never resolved
        std::string module, name;
        if (absl::Status s = Line(&module); !s.ok()) return s;
        if (absl::Status s = Line(&name); !s.ok()) return s;
        ValuePtr v = Make(Value::Kind::kGlobal);
        v->text = absl::StrCat(module, ".", name);
        return Push(std::move(v));
      }
      case 0x93: {  // STACK_GLOBAL
        absl::StatusOr<ValuePtr> name = Pop();
        if (!name.ok()) return name.status();
        absl::StatusOr<ValuePtr> module = Pop();
        if (!module.ok()) return module.status();
        if ((*name)->kind != Value::Kind::kString || (*module)->kind != Value::Kind::kString) {
          return Invalid("the pickle names a global with something that is not a string");
        }
        ValuePtr v = Make(Value::Kind::kGlobal);
        v->text = absl::StrCat((*module)->text, ".", (*name)->text);
        return Push(std::move(v));
      }
      case 'Q': {  // BINPERSID
        absl::StatusOr<ValuePtr> id = Pop();
        if (!id.ok()) return id.status();
        ValuePtr v = Make(Value::Kind::kPersistent);
        v->items.push_back(*std::move(id));
        return Push(std::move(v));
      }
      case 'R': {  // REDUCE: recorded as a call, never made
        absl::StatusOr<ValuePtr> args = Pop();
        if (!args.ok()) return args.status();
        absl::StatusOr<ValuePtr> callable = Pop();
        if (!callable.ok()) return callable.status();
        if ((*callable)->kind == Value::Kind::kGlobal && (*callable)->text == "collections.OrderedDict" &&
            (*args)->kind == Value::Kind::kTuple && (*args)->items.empty()) {
          return Push(Make(Value::Kind::kDict));
        }
        ValuePtr v = Make(Value::Kind::kCall);
        v->items = {*std::move(callable), *std::move(args)};
        return Push(std::move(v));
      }
      case 'b': {  // BUILD: the state does not change what a tensor is
        absl::StatusOr<ValuePtr> state = Pop();
        return state.ok() ? absl::OkStatus() : state.status();
      }
      default:
        return std::nullopt;
    }
  }

  // Tuples, and what fills dicts and lists.
  std::optional<absl::Status> Container(uint8_t op) {
    switch (op) {
      case 't': {  // TUPLE
        absl::StatusOr<std::vector<ValuePtr>> items = PopToMark();
        if (!items.ok()) return items.status();
        ValuePtr v = Make(Value::Kind::kTuple);
        v->items = *std::move(items);
        return Push(std::move(v));
      }
      case 0x85:
        return Tuple(1);
      case 0x86:
        return Tuple(2);
      case 0x87:
        return Tuple(3);
      case 's': {  // SETITEM
        absl::StatusOr<ValuePtr> value = Pop();
        if (!value.ok()) return value.status();
        absl::StatusOr<ValuePtr> key = Pop();
        if (!key.ok()) return key.status();
        return SetItems({*std::move(key), *std::move(value)});
      }
      case 'u': {  // SETITEMS
        absl::StatusOr<std::vector<ValuePtr>> items = PopToMark();
        if (!items.ok()) return items.status();
        return SetItems(*std::move(items));
      }
      case 'a':    // APPEND
      case 'e': {  // APPENDS
        std::vector<ValuePtr> items;
        if (op == 'a') {
          absl::StatusOr<ValuePtr> item = Pop();
          if (!item.ok()) return item.status();
          items.push_back(*std::move(item));
        } else {
          absl::StatusOr<std::vector<ValuePtr>> popped = PopToMark();
          if (!popped.ok()) return popped.status();
          items = *std::move(popped);
        }
        absl::StatusOr<ValuePtr> list = Pop();
        if (!list.ok()) return list.status();
        if ((*list)->kind != Value::Kind::kList) return Invalid("the pickle appends to something that is not a list");
        for (ValuePtr& item : items) (*list)->items.push_back(std::move(item));
        return Push(*std::move(list));
      }
      default:
        return std::nullopt;
    }
  }

  absl::string_view b_;
  size_t at_ = 0;
  bool done_ = false;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, ValuePtr> memo_;
  std::vector<std::unique_ptr<Value>> arena_;
};

// ---- from values to tensors -------------------------------------------------------------------

struct Storage {
  std::string dtype;
  int64_t element_size = 0;
};

bool StorageType(const std::string& global, Storage* out) {
  static const auto* types = new std::map<std::string, Storage>{
      {"torch.FloatStorage", {"float32", 4}},   {"torch.DoubleStorage", {"float64", 8}},
      {"torch.HalfStorage", {"float16", 2}},    {"torch.BFloat16Storage", {"bfloat16", 2}},
      {"torch.LongStorage", {"int64", 8}},      {"torch.IntStorage", {"int32", 4}},
      {"torch.ShortStorage", {"int16", 2}},     {"torch.CharStorage", {"int8", 1}},
      {"torch.ByteStorage", {"uint8", 1}},      {"torch.BoolStorage", {"bool", 1}},
  };
  auto it = types->find(global);
  if (it == types->end()) return false;
  *out = it->second;
  return true;
}

bool IntsOf(const Value& tuple, std::vector<int64_t>* out) {
  if (tuple.kind != Value::Kind::kTuple) return false;
  for (const ValuePtr& item : tuple.items) {
    if (item->kind != Value::Kind::kInt) return false;
    out->push_back(item->integer);
  }
  return true;
}

std::string KindName(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return "a bool";
    case Value::Kind::kInt: return "an int";
    case Value::Kind::kFloat: return "a float";
    case Value::Kind::kString: return "a string";
    case Value::Kind::kGlobal: return absl::StrCat("the global ", v.text);
    case Value::Kind::kTuple: return "a tuple";
    case Value::Kind::kList: return "a list";
    case Value::Kind::kDict: return "a dict";
    case Value::Kind::kPersistent: return "a storage";
    case Value::Kind::kCall:
      return v.items[0]->kind == Value::Kind::kGlobal ? absl::StrCat("an object made by ", v.items[0]->text)
                                                       : "an object";
  }
  return "something else";
}

// A tensor's description, with its storage key and the bytes it needs from that storage.
struct Described {
  TensorInfo info;
  std::string storage_key;
  uint64_t bytes_needed = 0;
};

absl::StatusOr<Described> DescribeTensor(const Value& v, const std::string& key, int depth = 0) {
  const std::string what = absl::StrCat("'", key, "' is ", KindName(v), ", not a tensor");
  if (v.kind != Value::Kind::kCall || v.items[0]->kind != Value::Kind::kGlobal || depth > 1) return Invalid(what);
  const std::string& fn = v.items[0]->text;
  const Value& args = *v.items[1];
  if (args.kind != Value::Kind::kTuple) return Invalid(what);
  // nn.Parameter(tensor): the tensor is its first argument.
  if (fn == "torch._utils._rebuild_parameter" || fn == "torch._utils._rebuild_parameter_with_state") {
    if (args.items.empty()) return Invalid(what);
    return DescribeTensor(*args.items[0], key, depth + 1);
  }
  if (fn != "torch._utils._rebuild_tensor_v2" && fn != "torch._utils._rebuild_tensor") return Invalid(what);
  if (args.items.size() < 4 || args.items[0]->kind != Value::Kind::kPersistent) return Invalid(what);
  const Value& id = *args.items[0]->items[0];
  if (id.kind != Value::Kind::kTuple || id.items.size() < 5 || id.items[1]->kind != Value::Kind::kGlobal ||
      id.items[2]->kind != Value::Kind::kString || id.items[4]->kind != Value::Kind::kInt) {
    return Invalid(absl::StrCat("'", key, "' is a tensor with a storage this reader does not know"));
  }
  Storage storage;
  if (!StorageType(id.items[1]->text, &storage)) {
    return Invalid(absl::StrCat("'", key, "' is a tensor of ", id.items[1]->text,
                                ", which fitrun does not train on (use a float, integer or bool tensor)"));
  }
  Described d;
  d.info.dtype = storage.dtype;
  d.storage_key = id.items[2]->text;
  std::vector<int64_t> stride;
  if (args.items[1]->kind != Value::Kind::kInt || !IntsOf(*args.items[2], &d.info.shape) ||
      !IntsOf(*args.items[3], &stride) || stride.size() != d.info.shape.size()) {
    return Invalid(absl::StrCat("'", key, "' is a tensor with a malformed shape"));
  }
  const int64_t offset = args.items[1]->integer;
  if (offset < 0) return Invalid(absl::StrCat("'", key, "' is a tensor with a malformed shape"));
  // The largest element index the tensor reaches, +1 (0 for an empty tensor).
  uint64_t extent = 1;
  for (size_t i = 0; i < d.info.shape.size(); ++i) {
    const int64_t n = d.info.shape[i];
    if (n < 0 || stride[i] < 0 || n > (int64_t{1} << 40) || stride[i] > (int64_t{1} << 40)) {
      return Invalid(absl::StrCat("'", key, "' is a tensor with a malformed shape"));
    }
    if (n == 0) extent = 0;
    if (extent > 0) extent += static_cast<uint64_t>(n - 1) * static_cast<uint64_t>(stride[i]);
  }
  d.bytes_needed = extent == 0 ? 0 : (static_cast<uint64_t>(offset) + extent) * storage.element_size;
  return d;
}

absl::StatusOr<std::map<std::string, TensorInfo>> ParseArchive(const ZipSource& source) {
  absl::StatusOr<std::map<std::string, ZipEntry>> entries = ReadZipDirectory(source);
  if (!entries.ok()) return entries.status();
  std::string prefix;
  const ZipEntry* pickle = nullptr;
  for (const auto& [name, entry] : *entries) {
    if (absl::EndsWith(name, "/data.pkl") && name.find('/') == name.size() - 9) {
      prefix = name.substr(0, name.size() - 8);
      pickle = &entry;
      break;
    }
  }
  if (pickle == nullptr) return Invalid("a zip archive without the data.pkl of torch.save");
  absl::StatusOr<std::string> bytes = ReadZipEntry(source, *pickle, kMaxPickleBytes);
  if (!bytes.ok()) return bytes.status();
  Unpickler unpickler(*bytes);
  absl::StatusOr<ValuePtr> top = unpickler.Run();
  if (!top.ok()) return top.status();
  if ((*top)->kind != Value::Kind::kDict) {
    return Invalid(absl::StrCat("it holds ", KindName(**top), "; save a dict of tensors, e.g. "
                                "torch.save({\"inputs\": x, \"target\": y}, path)"));
  }
  std::map<std::string, TensorInfo> out;
  const std::vector<ValuePtr>& items = (*top)->items;
  for (size_t i = 0; i + 1 < items.size(); i += 2) {
    if (items[i]->kind != Value::Kind::kString) {
      return Invalid(absl::StrCat("a key of its dict is ", KindName(*items[i]), "; the keys must be strings"));
    }
    const std::string& key = items[i]->text;
    absl::StatusOr<Described> d = DescribeTensor(*items[i + 1], key);
    if (!d.ok()) return d.status();
    auto data = entries->find(absl::StrCat(prefix, "data/", d->storage_key));
    if (d->bytes_needed > 0 && (data == entries->end() || data->second.size < d->bytes_needed)) {
      return Invalid(absl::StrCat("the bytes of tensor '", key, "' are missing from the archive (a truncated file?)"));
    }
    out[key] = std::move(d->info);
  }
  if (out.empty()) return Invalid("it holds an empty dict");
  return out;
}

}  // namespace

bool TensorInfo::floating() const {
  return dtype == "float32" || dtype == "float64" || dtype == "float16" || dtype == "bfloat16";
}

bool TensorInfo::integral() const {
  return dtype == "int64" || dtype == "int32" || dtype == "int16" || dtype == "int8" || dtype == "uint8";
}

std::string TensorInfo::Describe() const { return absl::StrCat(dtype, " [", absl::StrJoin(shape, ", "), "]"); }

absl::StatusOr<std::map<std::string, TensorInfo>> ParseTensorDict(absl::string_view file) {
  return ParseArchive(MemoryZipSource(file));
}

absl::StatusOr<std::map<std::string, TensorInfo>> ReadTensorDict(int fd, uint64_t size) {
  const int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return absl::InternalError(absl::StrCat("dup: ", std::strerror(errno)));
  FileZipSource source(own, size);
  return ParseArchive(source);
}

absl::StatusOr<std::map<std::string, TensorInfo>> ReadTensorDict(const std::string& path) {
  // Non-blocking: a FIFO would otherwise hold the open until a writer came.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open '", path, "': ", std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  FileZipSource source(fd, static_cast<uint64_t>(st.st_size));
  return ParseArchive(source);
}

}  // namespace fitrun::server
