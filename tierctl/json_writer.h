// A small streaming JSON writer: objects, arrays, strings (escaped per RFC 8259), integers,
// doubles and booleans, and protobuf messages through reflection. The caller keeps the nesting
// balanced; the writer places the commas.
#ifndef TIER_TIERCTL_JSON_WRITER_H_
#define TIER_TIERCTL_JSON_WRITER_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "google/protobuf/message.h"

namespace tier::ctl {

// `text` as a quoted JSON string. Control characters become escapes; bytes that are not valid
// UTF-8 become U+FFFD, so the output is always valid JSON.
std::string JsonQuote(std::string_view text);

class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& out) : out_(out) {}

  void BeginObject();
  void EndObject();
  void BeginArray();
  void EndArray();
  // Inside an object: the key of the value that follows.
  void Key(std::string_view key);

  void String(std::string_view value);
  void Uint(uint64_t value);
  void Int(int64_t value);
  void Double(double value);  // non-finite values become null
  void Bool(bool value);

  // Inside an object: a member, its key and then its value.
  void StringMember(std::string_view key, std::string_view value);
  void UintMember(std::string_view key, uint64_t value);
  void IntMember(std::string_view key, int64_t value);

 private:
  void BeforeValue();

  std::ostream& out_;
  std::vector<bool> first_in_scope_;  // one entry per open object or array
  bool after_key_ = false;
};

// Every field of `message` as members of the object being written, under its proto name (the
// snake_case names are part of the versioned API, so they stay stable); enums as lowercase value
// names, 64-bit integers as numbers. `only`, when given, limits it to the field of that name.
void WriteProtoFields(const google::protobuf::Message& message, JsonWriter& json,
                      std::string_view only = {});

}  // namespace tier::ctl

#endif  // TIER_TIERCTL_JSON_WRITER_H_
