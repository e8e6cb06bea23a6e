// JSON mode's recogniser against nlohmann::json on hand-written and random documents and their
// random mutations: every JSON object (within the whitespace and depth caps) is accepted byte by
// byte, anything it accepts as complete parses as an object, and no accepted prefix is a dead end.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/json_prefix.h"
#include "engine/json_schema.h"
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

// ---- string lengths and integer bounds (schemas: engine/json_schema.h) ----

std::shared_ptr<const JsonSchema> schema(const std::string& text) {
  auto s = JsonSchema::compile(nlohmann::ordered_json::parse(text));
  EXPECT_TRUE(s.ok()) << text << ": " << s.message();
  return s.ok() ? *s : JsonSchema::any_object();
}

// How many bytes of text a recogniser for the schema accepts, and whether the value is then complete.
std::pair<size_t, bool> run(const JsonSchema& s, const std::string& text) {
  JsonPrefix p(&s);
  for (size_t i = 0; i < text.size(); ++i)
    if (!p.feed(uint8_t(text[i]))) return {i, false};
  return {text.size(), p.complete()};
}

// {"v": VALUE}, v required, of the given schema.
std::shared_ptr<const JsonSchema> field(const std::string& value_schema) {
  return schema(R"({"type":"object","properties":{"v":)" + value_schema + R"(},"required":["v"]})");
}

std::string key_after(const JsonSchema& s, const std::string& text) {
  JsonPrefix p(&s);
  EXPECT_TRUE(p.feed(text)) << text;
  return p.key();
}

TEST(JsonPrefix, StringLengthsCountCodePoints) {
  const auto s = field(R"({"type":"string","minLength":2,"maxLength":3})");
  // Escapes, a surrogate pair and multi-byte UTF-8 sequences are one character each.
  for (const char* ok : {"ab", "abc", R"(\n\t)", R"(\"\\\/)", R"(\u00e9x)", R"(\ud83d\ude00\uD83D\uDE00)",
                         "\\ud83d\\ude00\xC3\xA9\xF0\x9F\x98\x80", "\xC3\xA9\xE6\x9D\xB1",
                         "\xF0\x9F\x98\x80\xF0\x9F\x98\x80"}) {
    const std::string text = std::string(R"({"v":")") + ok + "\"}";
    EXPECT_EQ(run(*s, text), std::make_pair(text.size(), true)) << text;
  }
  // Where each is refused: the closing quote below minLength, the first byte of a character past
  // maxLength (an escape's backslash, a UTF-8 lead byte).
  const std::pair<const char*, size_t> refused[] = {
      {R"({"v":"")", 6},
      {R"({"v":"a")", 7},
      {R"({"v":"\u00e9")", 12},
      {R"({"v":"\ud83d\ude00")", 18},
      {"{\"v\":\"\xF0\x9F\x98\x80\"", 10},
      {R"({"v":"abcd")", 9},
      {R"({"v":"abc\n")", 9},
      {R"({"v":"a\ud83d\ude00\u00e9\u00e9")", 25},
      {"{\"v\":\"abc\xC3\xA9\"", 9},
      {"{\"v\":\"\xE6\x9D\xB1\xE6\x9D\xB1\xE6\x9D\xB1\xE6\x9D\xB1\"", 15},
  };
  for (const auto& [text, at] : refused) EXPECT_EQ(run(*s, text).first, at) << text;
  // Limits of 0, and one-sided limits.
  const auto empty = field(R"({"type":"string","maxLength":0})");
  EXPECT_TRUE(run(*empty, R"({"v":""})").second);
  EXPECT_EQ(run(*empty, R"({"v":"a"})").first, 6u);
  const auto at_least = field(R"({"type":"string","minLength":3})");
  EXPECT_TRUE(run(*at_least, R"({"v":"abcdefgh"})").second);
  EXPECT_EQ(run(*at_least, R"({"v":"ab"})").first, 8u);
  const auto at_most = field(R"({"type":["string","null"],"maxLength":1})");
  EXPECT_TRUE(run(*at_most, R"({"v":""})").second);
  EXPECT_TRUE(run(*at_most, R"({"v":null})").second);
  EXPECT_EQ(run(*at_most, R"({"v":"ab"})").first, 7u);
}

TEST(JsonPrefix, StringLengthsApplyToTheNodesOwnStrings) {
  // Each array item is counted from 0; a free object's keys and values are not counted.
  const auto items = field(R"({"type":"array","items":{"type":"string","maxLength":1}})");
  EXPECT_TRUE(run(*items, R"({"v":["a","b",""]})").second);
  EXPECT_EQ(run(*items, R"({"v":["a","bc"]})").first, 12u);
  const auto free = schema(R"({"type":"object","maxLength":1,"minLength":1})");
  EXPECT_TRUE(run(*free, R"({"long key":"long value","":""})").second);
  const auto branch = field(R"({"anyOf":[{"type":"string","minLength":1},{"type":"null"}]})");
  EXPECT_TRUE(run(*branch, R"({"v":"x"})").second);
  EXPECT_TRUE(run(*branch, R"({"v":null})").second);
  EXPECT_EQ(run(*branch, R"({"v":""})").first, 6u);
}

// key() normalises the count: states whose futures are the same share a key (and a cached mask).
TEST(JsonPrefix, StringLengthKeysShareWhenTheCountNoLongerMatters) {
  const auto at_least = field(R"({"type":"string","minLength":2})");
  EXPECT_NE(key_after(*at_least, R"({"v":"a)"), key_after(*at_least, R"({"v":"ab)"));
  EXPECT_EQ(key_after(*at_least, R"({"v":"ab)"), key_after(*at_least, R"({"v":"abcdef)"));
  const auto at_most = field(R"({"type":"string","maxLength":5})");
  EXPECT_NE(key_after(*at_most, R"({"v":"ab)"), key_after(*at_most, R"({"v":"abc)"));
  const auto free = field(R"({"type":"string"})");
  EXPECT_EQ(key_after(*free, R"({"v":")"), key_after(*free, R"({"v":"abc)"));
  // Nothing of the value remains after it.
  EXPECT_EQ(key_after(*at_most, R"({"v":"ab")"), key_after(*at_most, R"({"v":"abc")"));
}

// The decimal texts of the integers in [lo, hi] ("-0" too where 0 is in).
std::set<std::string> integer_texts(int64_t lo, int64_t hi) {
  std::set<std::string> texts;
  for (int64_t x = lo; x <= hi; ++x) texts.insert(std::to_string(x));
  if (lo <= 0 && hi >= 0) texts.insert("-0");
  return texts;
}

// Exhaustive on small ranges: every text of up to 5 bytes over "-0123456789" is refused at the
// first byte that no integer text within the bounds begins with (no sooner, no later: no dead
// ends), and '}' after it is accepted exactly when it is one of those texts.
TEST(JsonPrefix, IntegerBoundsRefuseEachByteAsSoonAsNoIntegerFits) {
  std::vector<std::pair<int64_t, int64_t>> ranges = {{-5, 12}, {-20, -10}, {0, 0},     {10, 20},  {1, 1000},
                                                     {-999, -1}, {7, 7},   {-1, 1},    {100, 150}, {-150, 99}};
  std::mt19937 rng(7);
  for (int i = 0; i < 10; ++i) {
    const int64_t a = int64_t(rng() % 2400) - 1200, b = int64_t(rng() % 2400) - 1200;
    ranges.emplace_back(std::min(a, b), std::max(a, b));
  }
  std::vector<std::string> candidates = {""};
  for (size_t i = 0; i < candidates.size(); ++i)
    if (candidates[i].size() < 5)
      for (char d : std::string("-0123456789")) candidates.push_back(candidates[i] + d);
  for (const auto& [lo, hi] : ranges) {
    const auto s = field(R"({"type":"integer","minimum":)" + std::to_string(lo) + R"(,"maximum":)" +
                         std::to_string(hi) + "}");
    const std::set<std::string> texts = integer_texts(lo, hi);
    std::set<std::string> prefixes;
    for (const auto& t : texts)
      for (size_t n = 1; n <= t.size(); ++n) prefixes.insert(t.substr(0, n));
    for (const auto& c : candidates) {
      if (c.empty()) continue;
      size_t good = 0;  // the longest start of c that begins an integer text within the bounds
      while (good < c.size() && prefixes.count(c.substr(0, good + 1))) ++good;
      const std::string text = R"({"v":)" + c + "}";
      const bool whole = texts.count(c) > 0;
      ASSERT_EQ(run(*s, text), std::make_pair(5 + good + whole, whole)) << "[" << lo << ", " << hi << "] " << text;
    }
  }
}

TEST(JsonPrefix, IntegerBoundsAtTheEdges) {
  struct Case {
    const char* bounds;
    std::vector<const char*> ok, bad;
  };
  const Case cases[] = {
      {R"("maximum":5)", {"5", "0", "-0", "-7", "-123456789012345678901234567890"}, {"6", "50", "10", "00"}},
      {R"("minimum":-5,"maximum":12)", {"-5", "-1", "-0", "0", "1", "12"}, {"-6", "-10", "13", "-05", "00", "01"}},
      {R"("minimum":-20,"maximum":-10)", {"-20", "-15", "-10"}, {"-21", "-9", "-0", "0", "-1", "5"}},
      {R"("minimum":1)", {"1", "123456789012345678901234567890"}, {"0", "-0", "-1"}},
      {R"("minimum":0,"maximum":0)", {"0", "-0"}, {"1", "-1", "00"}},
      {R"("exclusiveMinimum":3,"exclusiveMaximum":7)", {"4", "6"}, {"3", "7"}},
      {R"("minimum":2.5,"maximum":4.5)", {"3", "4"}, {"2", "5"}},
      {R"("exclusiveMinimum":-2.5,"exclusiveMaximum":-0.5)", {"-2", "-1"}, {"-3", "0", "-0"}},
      {R"("minimum":-9223372036854775808,"maximum":9223372036854775807)",
       {"9223372036854775807", "-9223372036854775808", "-0", "922337203685477580"},
       {"9223372036854775808", "-9223372036854775809", "92233720368547758070", "10000000000000000000"}},
      {R"("exclusiveMinimum":-9223372036854775808,"exclusiveMaximum":9223372036854775807)",
       {"9223372036854775806", "-9223372036854775807"}, {"9223372036854775807", "-9223372036854775808"}},
      {R"("minimum":9223372036854775807)", {"9223372036854775807", "9223372036854775808", "99999999999999999999999"},
       {"9223372036854775806", "0", "-9223372036854775807"}},
      {R"("maximum":-9223372036854775808)", {"-9223372036854775808", "-99999999999999999999999"},
       {"-9223372036854775807", "0", "-0", "1"}},
  };
  for (const auto& c : cases) {
    const auto s = field(std::string(R"({"type":"integer",)") + c.bounds + "}");
    for (const char* ok : c.ok) {
      const std::string text = std::string(R"({"v":)") + ok + "}";
      EXPECT_TRUE(run(*s, text).second) << c.bounds << ": " << text;
    }
    for (const char* bad : c.bad) {
      const std::string text = std::string(R"({"v":)") + bad + "}";
      EXPECT_FALSE(run(*s, text).second) << c.bounds << ": " << text;
    }
  }
}

// Exactly which byte is refused: a digit no integer within the bounds begins with, or the byte
// after a number that is a prefix of some but not itself within the bounds.
TEST(JsonPrefix, IntegerBoundsRefuseTheFirstByteBeyond) {
  const auto s = field(R"({"type":"integer","minimum":-10,"maximum":5})");
  EXPECT_EQ(run(*s, R"({"v":6})").first, 5u);    // nothing in [-10, 5] begins with 6
  EXPECT_EQ(run(*s, R"({"v":-12})").first, 7u);  // -1 and -10 begin with -1; nothing with -12
  EXPECT_EQ(run(*s, R"({"v":3 })"), std::make_pair(size_t(8), true));  // 3 ends at once; then ws, '}'
  const auto above = field(R"({"type":"integer","minimum":10,"maximum":20})");
  EXPECT_EQ(run(*above, R"({"v":1})").first, 6u);  // 1 may go on (10..19), but is below: '}' refused
  EXPECT_EQ(run(*above, R"({"v":-)").first, 5u);   // no integer <= 0, not even -0
  EXPECT_EQ(run(*above, R"({"v":0)").first, 5u);
  // '-' accepted only when some integer <= 0 is within: -0 is 0.
  EXPECT_EQ(run(*field(R"({"type":"integer","minimum":0})"), R"({"v":-0})"), std::make_pair(size_t(8), true));
  EXPECT_EQ(run(*field(R"({"type":"integer","minimum":0})"), R"({"v":-1})").first, 6u);
  // At the top level a bounded integer is complete once no digit may follow.
  const auto top = schema(R"({"type":"integer","minimum":-3,"maximum":5})");
  for (const char* whole : {"5", "0", "-0", "-3", "2"})
    EXPECT_EQ(run(*top, whole), std::make_pair(strlen(whole), true)) << whole;
  EXPECT_EQ(run(*top, "-"), std::make_pair(size_t(1), false));
}

// Keys share once the digits no longer matter, and nothing of a number remains after it.
TEST(JsonPrefix, IntegerKeysShareWhenTheDigitsNoLongerMatter) {
  const auto any = field(R"({"type":"integer"})");
  EXPECT_EQ(key_after(*any, R"({"v":5)"), key_after(*any, R"({"v":-123)"));
  const auto at_least = field(R"({"type":"integer","minimum":100})");
  EXPECT_NE(key_after(*at_least, R"({"v":1)"), key_after(*at_least, R"({"v":12)"));
  EXPECT_EQ(key_after(*at_least, R"({"v":100)"), key_after(*at_least, R"({"v":98765)"));
  const auto at_most = field(R"({"type":"integer","maximum":-100})");
  EXPECT_EQ(key_after(*at_most, R"({"v":-100)"), key_after(*at_most, R"({"v":-98765)"));
  const auto range = field(R"({"type":"integer","minimum":0,"maximum":1000})");
  EXPECT_NE(key_after(*range, R"({"v":1)"), key_after(*range, R"({"v":2)"));  // exact while they matter
  EXPECT_EQ(key_after(*range, R"({"v":1000)"), key_after(*range, R"({"v":123)"));  // ended: no digit may follow
  EXPECT_EQ(key_after(*range, R"({"v":1000)"), key_after(*range, R"({"v":999)"));
}

// MagnitudeRange against brute force: every small range (either side possibly absent), both
// signs, every prefix of up to 3 digits: which magnitudes within the range begin with it, are it,
// and are longer.
TEST(JsonPrefix, MagnitudeRangeAgreesWithBruteForce) {
  std::vector<std::optional<int64_t>> bounds = {std::nullopt};
  for (int64_t b = -40; b <= 40; ++b) bounds.push_back(b);
  for (const auto& lo : bounds) {
    for (const auto& hi : bounds) {
      if (lo && hi && *lo > *hi) continue;
      // Integers of up to 5 digits suffice: with bounds within +-40, a prefix of up to 3 digits
      // begins some integer within them with at most 2 more digits, or none.
      const int64_t from = lo.value_or(-99999), to = hi.value_or(99999);
      for (bool negative : {false, true}) {
        std::vector<bool> begins(1000), is(1000), longer(1000);  // by prefix
        bool any = false;
        for (int64_t x = from; x <= to; ++x) {
          if (x != 0 && (x < 0) != negative) continue;
          any = true;
          const int64_t m = x < 0 ? -x : x;
          if (m < 1000) is[size_t(m)] = true;
          if (m == 0) begins[0] = true;
          for (int64_t q = m, proper = 0; q > 0; q /= 10, proper = 1) {  // m's prefixes: m, m / 10, ...
            if (q >= 1000) continue;
            begins[size_t(q)] = true;
            if (proper) longer[size_t(q)] = true;
          }
        }
        const MagnitudeRange r(lo, hi, negative);
        std::ostringstream where;
        where << "[" << (lo ? std::to_string(*lo) : "none") << ", " << (hi ? std::to_string(*hi) : "none")
              << "] negative " << negative;
        ASSERT_EQ(r.empty(), !any) << where.str();
        for (uint64_t p = 0; p < 1000; ++p) {
          ASSERT_EQ(r.has_prefix(p), begins[p]) << where.str() << " prefix " << p;
          ASSERT_EQ(r.contains(p), is[p]) << where.str() << " magnitude " << p;
          ASSERT_EQ(r.extends(p), longer[p]) << where.str() << " prefix " << p;
        }
      }
    }
  }
}

// Near the int64 extremes, where a careless prefix * 10 overflows: brute force over 301 integers.
TEST(JsonPrefix, MagnitudeRangeAtTheInt64Extremes) {
  const std::pair<int64_t, int64_t> ranges[] = {{INT64_MAX - 300, INT64_MAX}, {INT64_MIN, INT64_MIN + 300},
                                                {INT64_MAX / 10 - 150, INT64_MAX / 10 + 150}};
  for (const auto& [lo, hi] : ranges) {
    const bool negative = hi < 0;
    std::set<std::string> texts;
    for (int64_t x = lo;; ++x) {
      texts.insert(negative ? std::to_string(0 - uint64_t(x)) : std::to_string(x));
      if (x == hi) break;
    }
    const MagnitudeRange r(lo, hi, negative);
    // Candidates: every prefix of the magnitudes from about 1000 below to 1000 above the range,
    // and those magnitudes with one more digit.
    const uint64_t center = negative ? 0 - uint64_t(lo) - 150 : uint64_t(lo) + 150;
    std::set<std::string> candidates;
    for (uint64_t m = center - 1200; m != center + 1200; ++m) {
      const std::string t = std::to_string(m);
      for (size_t n = 1; n <= t.size(); ++n) candidates.insert(t.substr(0, n));
      candidates.insert(t + "0");
    }
    for (const auto& c : candidates) {
      auto it = texts.lower_bound(c);
      const bool begins = it != texts.end() && it->compare(0, c.size(), c) == 0;
      const bool fits = c.size() < 20 || (c.size() == 20 && c <= "18446744073709551615");
      const uint64_t p = fits ? std::stoull(c) : MagnitudeRange::kNoBound;
      EXPECT_EQ(r.has_prefix(p), begins) << "[" << lo << ", " << hi << "] prefix " << c;
    }
  }
  // A saturated prefix stands for one beyond 64 bits: only a side without a bound takes it.
  EXPECT_TRUE(MagnitudeRange(0, std::nullopt, false).has_prefix(MagnitudeRange::kNoBound));
  EXPECT_FALSE(MagnitudeRange(0, INT64_MAX, false).has_prefix(MagnitudeRange::kNoBound));
  EXPECT_TRUE(MagnitudeRange(std::nullopt, 0, true).has_prefix(MagnitudeRange::kNoBound));
  EXPECT_FALSE(MagnitudeRange(INT64_MIN, 0, true).has_prefix(MagnitudeRange::kNoBound));
  EXPECT_EQ(MagnitudeRange::append(1844674407370955161, 4), 18446744073709551614u);
  EXPECT_EQ(MagnitudeRange::append(1844674407370955161, 6), MagnitudeRange::kNoBound);
  EXPECT_EQ(MagnitudeRange::append(UINT64_MAX / 3, 0), MagnitudeRange::kNoBound);
}

}  // namespace
}  // namespace escala::engine
