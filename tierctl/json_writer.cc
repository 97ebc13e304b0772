#include "tierctl/json_writer.h"

#include <charconv>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace tier::ctl {
namespace {

// Length of the valid UTF-8 sequence at the start of `s`, or 0 if it is not one (overlong forms,
// surrogates and code points past U+10FFFF are invalid).
size_t Utf8SequenceLength(std::string_view s) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  size_t len = 0;
  if (lead >= 0xC2 && lead <= 0xDF) len = 2;
  if (lead >= 0xE0 && lead <= 0xEF) len = 3;
  if (lead >= 0xF0 && lead <= 0xF4) len = 4;
  if (len == 0 || s.size() < len) return 0;
  uint32_t code = lead & (0x7F >> len);  // the lead byte's payload bits
  for (size_t i = 1; i < len; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(i) & 0x3F);
  }
  static constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < kMinForLength[len] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return len;
}

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// Field `field` of `message`; element `i` of it when repeated.
void WriteProtoValue(const Message& message, const FieldDescriptor* field, int i,
                     JsonWriter& json) {
  const google::protobuf::Reflection& r = *message.GetReflection();
  const bool rep = field->is_repeated();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return json.Int(rep ? r.GetRepeatedInt32(message, field, i) : r.GetInt32(message, field));
    case FieldDescriptor::CPPTYPE_INT64:
      return json.Int(rep ? r.GetRepeatedInt64(message, field, i) : r.GetInt64(message, field));
    case FieldDescriptor::CPPTYPE_UINT32:
      return json.Uint(rep ? r.GetRepeatedUInt32(message, field, i) : r.GetUInt32(message, field));
    case FieldDescriptor::CPPTYPE_UINT64:
      return json.Uint(rep ? r.GetRepeatedUInt64(message, field, i) : r.GetUInt64(message, field));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return json.Double(rep ? r.GetRepeatedDouble(message, field, i)
                             : r.GetDouble(message, field));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return json.Double(rep ? r.GetRepeatedFloat(message, field, i) : r.GetFloat(message, field));
    case FieldDescriptor::CPPTYPE_BOOL:
      return json.Bool(rep ? r.GetRepeatedBool(message, field, i) : r.GetBool(message, field));
    case FieldDescriptor::CPPTYPE_ENUM:
      return json.String(absl::AsciiStrToLower(
          (rep ? r.GetRepeatedEnum(message, field, i) : r.GetEnum(message, field))->name()));
    case FieldDescriptor::CPPTYPE_STRING:
      return json.String(rep ? r.GetRepeatedString(message, field, i)
                             : r.GetString(message, field));
    case FieldDescriptor::CPPTYPE_MESSAGE:
      json.BeginObject();
      WriteProtoFields(rep ? r.GetRepeatedMessage(message, field, i) : r.GetMessage(message, field),
                       json);
      return json.EndObject();
  }
}

}  // namespace

void WriteProtoFields(const Message& message, JsonWriter& json, std::string_view only) {
  const google::protobuf::Descriptor& descriptor = *message.GetDescriptor();
  for (int k = 0; k < descriptor.field_count(); ++k) {
    const FieldDescriptor* field = descriptor.field(k);
    if (!only.empty() && field->name() != only) continue;
    json.Key(field->name());
    if (!field->is_repeated()) {
      WriteProtoValue(message, field, -1, json);
      continue;
    }
    json.BeginArray();
    const int size = message.GetReflection()->FieldSize(message, field);
    for (int i = 0; i < size; ++i) WriteProtoValue(message, field, i, json);
    json.EndArray();
  }
}

std::string JsonQuote(std::string_view text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else if (size_t len = Utf8SequenceLength(text.substr(i)); len > 0) {
          out.append(text.substr(i, len));
          i += len;
          continue;
        } else {
          out += "\\ufffd";
        }
    }
    ++i;
  }
  out += '"';
  return out;
}

void JsonWriter::BeforeValue() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_in_scope_.empty()) {
    if (!first_in_scope_.back()) out_ << ',';
    first_in_scope_.back() = false;
  }
}

void JsonWriter::BeginObject() {
  BeforeValue();
  out_ << '{';
  first_in_scope_.push_back(true);
}

void JsonWriter::EndObject() {
  first_in_scope_.pop_back();
  out_ << '}';
}

void JsonWriter::BeginArray() {
  BeforeValue();
  out_ << '[';
  first_in_scope_.push_back(true);
}

void JsonWriter::EndArray() {
  first_in_scope_.pop_back();
  out_ << ']';
}

void JsonWriter::Key(std::string_view key) {
  BeforeValue();
  out_ << JsonQuote(key) << ':';
  after_key_ = true;
}

void JsonWriter::String(std::string_view value) {
  BeforeValue();
  out_ << JsonQuote(value);
}

void JsonWriter::Uint(uint64_t value) {
  BeforeValue();
  out_ << value;
}

void JsonWriter::Int(int64_t value) {
  BeforeValue();
  out_ << value;
}

void JsonWriter::Double(double value) {
  BeforeValue();
  if (!std::isfinite(value)) {
    out_ << "null";
    return;
  }
  // Shortest text that reads back as the same double; never locale-dependent.
  char buf[32];
  const auto result = std::to_chars(buf, buf + sizeof(buf), value);
  out_ << std::string_view(buf, result.ptr - buf);
}

void JsonWriter::Bool(bool value) {
  BeforeValue();
  out_ << (value ? "true" : "false");
}

void JsonWriter::StringMember(std::string_view key, std::string_view value) {
  Key(key);
  String(value);
}

void JsonWriter::UintMember(std::string_view key, uint64_t value) {
  Key(key);
  Uint(value);
}

void JsonWriter::IntMember(std::string_view key, int64_t value) {
  Key(key);
  Int(value);
}

}  // namespace tier::ctl
