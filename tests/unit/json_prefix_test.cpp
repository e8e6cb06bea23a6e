// JSON mode's recogniser against nlohmann::json on hand-written and random documents and their
// random mutations: every JSON object (within the whitespace and depth caps) is accepted byte by
// byte, anything it accepts as complete parses as an object, and no accepted prefix is a dead end.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <random>
#include <string>
#include <vector>

#include "engine/json_prefix.h"
#include "json_reference.h"

namespace escala::engine {
namespace {

// Feeds all of s: how many bytes were accepted, and whether the object is then complete.
std::pair<size_t, bool> run(const std::string& s) {
  JsonPrefix p;
  for (size_t i = 0; i < s.size(); ++i)
    if (!p.feed(uint8_t(s[i]))) return {i, false};
  return {s.size(), p.complete()};
}

bool accepted_whole(const std::string& s) {
  auto [n, done] = run(s);
  return n == s.size() && done;
}

TEST(JsonPrefix, AcceptsObjects) {
  for (const char* doc : {
           "{}", " {\n}", R"({"a":1})", R"({"a": [1, -2.5e+3, 0, -0.0, 1E9, true, false, null, "x"]})",
           R"({"k": {"n": {"m": []}}, "s": "tab\t esc \" \\ \/ \b \f \n \r \u00e9 \uD83D\uDE00"})",
           "{\"utf8\": \"caf\xC3\xA9 \xE6\x9D\xB1 \xF0\x9F\x98\x80\"}", R"({"":""})", R"({"a":[[],[{}]]})"}) {
    EXPECT_TRUE(accepted_whole(doc)) << doc << " stopped at " << run(doc).first;
  }
}

TEST(JsonPrefix, RefusesWhatNoObjectStartsWith) {
  for (const char* bad : {"[]", "1", "\"x\"", "{a}", "{\"a\" 1}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":.5}",
                          "{\"a\":-}", "{\"a\":1e}", "{\"a\":tru}", "{\"a\":nul1}", "{\"a\":1,}", "{,}",
                          "{\"a\":[1,]}", "{\"a\":\"\x01\"}", "{\"a\":\"\\x\"}", "{\"a\":\"\\uDC00\"}",
                          "{\"a\":\"\\uD800x\"}", "{\"a\":\"\\uD800\\n\"}", "{\"a\":\"\\uD800\\uD800\"}",
                          "{\"a\":\"\xC0\xAF\"}", "{\"a\":\"\xED\xA0\x80\"}", "{\"a\":\"\xF4\x90\x80\x80\"}",
                          "{\"a\":\"\xE2\x82\"}", "{} ", "{}{}", "{\"a\":1]", "{\"a\":[1}"}) {
    EXPECT_FALSE(accepted_whole(bad)) << bad;
    EXPECT_FALSE(nlohmann::json::accept(bad) && nlohmann::json::parse(bad).is_object() &&
                 std::string(bad).back() != ' ')
        << bad << " (the list must hold only non-objects)";
  }
  std::string ws = "{" + std::string(JsonPrefix::kMaxWhitespaceRun, ' ');
  EXPECT_EQ(run(ws).first, ws.size());
  EXPECT_EQ(run(ws + " ").first, ws.size());  // one more is refused
  EXPECT_TRUE(accepted_whole(ws + "}"));
  std::string deep = "{\"a\":" + std::string(40, '[');
  EXPECT_LT(run(deep).first, deep.size());  // the depth cap
}

nlohmann::json random_value(std::mt19937& rng, int depth) {
  const int kind = int(rng() % (depth > 0 ? 8 : 6));
  auto random_string = [&] {
    static const std::vector<std::string> parts = {"a", "b", " ", "\"", "\\", "\n", "\t", "\x01", "/", "\xC3\xA9",
                                                   "\xE6\x9D\xB1", "\xF0\x9F\x98\x80", "0", "}", "]"};
    std::string s;
    for (int i = int(rng() % 6); i > 0; --i) s += parts[rng() % parts.size()];
    return s;
  };
  switch (kind) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return int64_t(rng()) - int64_t(1u << 31);
    case 3: return std::ldexp(double(int32_t(rng())), int(rng() % 200) - 100);
    case 4: return random_string();
    case 5: return uint64_t(rng()) << (rng() % 32);
    case 6: {
      nlohmann::json a = nlohmann::json::array();
      for (int i = int(rng() % 4); i > 0; --i) a.push_back(random_value(rng, depth - 1));
      return a;
    }
    default: {
      nlohmann::json o = nlohmann::json::object();
      for (int i = int(rng() % 4); i > 0; --i) o[random_string()] = random_value(rng, depth - 1);
      return o;
    }
  }
}

std::string random_object_text(std::mt19937& rng) {
  nlohmann::json o = nlohmann::json::object();
  for (int i = int(rng() % 5); i > 0; --i) o[std::to_string(i)] = random_value(rng, 4);
  const int indent = int(rng() % 4) - 1;  // -1: compact
  return o.dump(indent, ' ', /*ensure_ascii=*/rng() % 2 == 0);
}

TEST(JsonPrefix, AgreesWithNlohmannOnRandomDocumentsAndMutations) {
  std::mt19937 rng(std::random_device{}());
  const std::string alphabet = "{}[]\":,0123456789.-+eEtruefalsn \n\\u/abDCE\x01\xC3\xA9\xED\xA0\xF0\x9F";
  int complete_mutants = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const std::string doc = random_object_text(rng);
    ASSERT_TRUE(accepted_whole(doc)) << doc << " stopped at " << run(doc).first;
    std::string m = doc;
    for (int k = int(rng() % 3) + 1; k > 0; --k) {
      const size_t at = m.empty() ? 0 : rng() % m.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0: if (!m.empty()) m[at] = c; break;
        case 1: m.insert(m.begin() + std::ptrdiff_t(at), c); break;
        default: if (!m.empty()) m.erase(at, 1);
      }
    }
    JsonPrefix p;
    size_t i = 0;
    for (; i < m.size(); ++i) {
      ASSERT_TRUE(test::can_continue(p)) << "dead end after " << i << " bytes of " << m;
      if (!p.feed(uint8_t(m[i]))) break;
    }
    const bool ok = i == m.size() && p.complete();
    const bool reference = test::is_json_object(m);
    const bool trailing_ws = !m.empty() && (m.back() == ' ' || m.back() == '\n');
    if (ok) {
      ++complete_mutants;
      EXPECT_TRUE(reference) << "accepted a non-object: " << ::testing::PrintToString(m);
    } else if (reference && !trailing_ws && m.find(std::string(JsonPrefix::kMaxWhitespaceRun + 1, ' ')) == std::string::npos) {
      ADD_FAILURE() << "refused an object at byte " << i << ": " << ::testing::PrintToString(m);
    }
  }
  EXPECT_GT(complete_mutants, 100);  // the mutations keep many documents valid: both sides tested
}

TEST(JsonPrefix, TokenMasksFollowTheRecogniser) {
  JsonTokenMasks masks({"{", "\"", "}", "", "{\"", "a", "\":", " 1", "}}", "\"a\": 1}", "\xC3", "\xA9"});
  JsonPrefix p;
  std::vector<uint8_t> m = masks.allowed(p);
  EXPECT_EQ(m, (std::vector<uint8_t>{1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}));
  ASSERT_TRUE(p.feed("{"));
  m = masks.allowed(p);
  // "}}" closes too much; "\":" opens a key holding ':'.
  EXPECT_EQ(m, (std::vector<uint8_t>{0, 1, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0}));
  ASSERT_TRUE(p.feed("\"a"));
  m = masks.allowed(p);
  // Inside the key anything but a lone continuation byte; "\"a\": 1}" would put 'a' after it.
  EXPECT_EQ(m, (std::vector<uint8_t>{1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 0}));
  ASSERT_TRUE(p.feed("\xC3"));
  EXPECT_EQ(masks.allowed(p), (std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}));
}

}  // namespace
}  // namespace escala::engine
