#include "tierctl/json_writer.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>

#include "gtest/gtest.h"
#include "tier.pb.h"

namespace tier::ctl {
namespace {

TEST(JsonQuoteTest, EscapesQuotesBackslashesAndControls) {
  EXPECT_EQ(JsonQuote(""), R"("")");
  EXPECT_EQ(JsonQuote(R"(a"b\c)"), R"("a\"b\\c")");
  EXPECT_EQ(JsonQuote("l1\nl2\tx\r\b\f"), R"("l1\nl2\tx\r\b\f")");
  EXPECT_EQ(JsonQuote(std::string("nul\0one\x01 del\x7f", 13)), "\"nul\\u0000one\\u0001 del\x7f\"");
  EXPECT_EQ(JsonQuote("/slash stays"), R"("/slash stays")");
}

TEST(JsonQuoteTest, KeepsValidUtf8) {
  EXPECT_EQ(JsonQuote("h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "\"h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80\"");
}

TEST(JsonQuoteTest, ReplacesInvalidUtf8) {
  EXPECT_EQ(JsonQuote("a\xFFz"), R"("a\ufffdz")");
  EXPECT_EQ(JsonQuote("cut\xC3"), R"("cut\ufffd")");
  EXPECT_EQ(JsonQuote("\xC3(x"), R"("\ufffd(x")");                    // bad continuation
  EXPECT_EQ(JsonQuote("\xC0\xAF"), R"("\ufffd\ufffd")");              // overlong '/'
  EXPECT_EQ(JsonQuote("\xED\xA0\x80"), R"("\ufffd\ufffd\ufffd")");    // surrogate D800
  EXPECT_EQ(JsonQuote("\xF4\x90\x80\x80"), R"("\ufffd\ufffd\ufffd\ufffd")");  // past U+10FFFF
}

TEST(JsonWriterTest, NestsAndPlacesCommas) {
  std::ostringstream out;
  JsonWriter w(out);
  w.BeginObject();
  w.Key("name");
  w.String("host");
  w.Key("bytes");
  w.Uint(uint64_t{18446744073709551615ull});
  w.Key("pid");
  w.Int(int32_t{-1});
  w.Key("locked");
  w.Bool(true);
  w.Key("tiers");
  w.BeginArray();
  w.BeginObject();
  w.Key("a");
  w.Uint(uint32_t{1});
  w.EndObject();
  w.BeginObject();
  w.EndObject();
  w.String("x");
  w.BeginArray();
  w.EndArray();
  w.EndArray();
  w.Key("empty");
  w.BeginObject();
  w.EndObject();
  w.Key("off");
  w.Bool(false);
  w.EndObject();
  EXPECT_EQ(out.str(),
            R"({"name":"host","bytes":18446744073709551615,"pid":-1,"locked":true,)"
            R"("tiers":[{"a":1},{},"x",[]],"empty":{},"off":false})");
}

TEST(JsonWriterTest, DoublesRoundTripAndNonFiniteIsNull) {
  std::ostringstream out;
  JsonWriter w(out);
  w.BeginArray();
  w.Double(0.5);
  w.Double(23.4e9);
  w.Double(0.1);
  w.Double(1e21);
  w.Double(std::numeric_limits<double>::infinity());
  w.Double(std::nan(""));
  w.EndArray();
  EXPECT_EQ(out.str(), "[0.5,2.34e+10,0.1,1e+21,null,null]");
}

TEST(JsonWriterTest, EscapesKeysToo) {
  std::ostringstream out;
  JsonWriter w(out);
  w.BeginObject();
  w.Key("we\"ird");
  w.String("v\n");
  w.EndObject();
  EXPECT_EQ(out.str(), R"({"we\"ird":"v\n"})");
}

TEST(JsonWriterTest, MembersAreKeyThenValue) {
  std::ostringstream out;
  JsonWriter w(out);
  w.BeginObject();
  w.StringMember("name", "nv\"me");
  w.UintMember("bytes", uint64_t{18446744073709551615ull});
  w.IntMember("pid", int32_t{-1});
  w.EndObject();
  EXPECT_EQ(out.str(), R"({"name":"nv\"me","bytes":18446744073709551615,"pid":-1})");
}

std::string ProtoJson(const google::protobuf::Message& message, std::string_view only = {}) {
  std::ostringstream out;
  JsonWriter w(out);
  w.BeginObject();
  WriteProtoFields(message, w, only);
  w.EndObject();
  return out.str();
}

TEST(WriteProtoFieldsTest, EveryFieldUnderItsProtoNameDefaultsIncluded) {
  EXPECT_EQ(ProtoJson(v1::DrainResponse()), R"({"jobs_in_flight":0})");
  v1::HealthResponse health;
  health.set_state(v1::HealthResponse::DRAINING);
  EXPECT_EQ(ProtoJson(health), R"({"state":"draining","reason":""})");
}

TEST(WriteProtoFieldsTest, RepeatedMessagesAndOnlyOneField) {
  v1::GetStatusResponse status;
  status.set_version("0.1.0");
  v1::TierStatus* host = status.add_tiers();
  host->set_name("host");
  host->set_capacity_bytes(18446744073709551615ull);
  host->set_objects(2);
  status.add_tiers()->set_name("nv\"me");
  EXPECT_EQ(ProtoJson(status, "tiers"),
            R"({"tiers":[{"name":"host","capacity_bytes":18446744073709551615,"used_bytes":0,)"
            R"("free_bytes":0,"objects":2},{"name":"nv\"me","capacity_bytes":0,"used_bytes":0,)"
            R"("free_bytes":0,"objects":0}]})");
  EXPECT_EQ(ProtoJson(v1::ListSessionsResponse()), R"({"sessions":[]})");
  v1::SessionInfo session;
  session.set_pid(-1);
  session.set_attached(true);
  const std::string json = ProtoJson(session);
  EXPECT_NE(json.find(R"("attached":true,"pid":-1,"uid":0,)"), std::string::npos) << json;
}

}  // namespace
}  // namespace tier::ctl
