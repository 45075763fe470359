// model::JsonPrefix (model/json_prefix.h) against nlohmann::json's parser: every prefix of a valid object text is
// accepted and complete() holds exactly at its end; a text the recognizer reads whole and calls complete is one the
// parser accepts as an object; random byte mutations never make the two disagree.
#include "model/json_prefix.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "support/test_support.h"

namespace cm = cider::model;
using nlohmann::json;

namespace {

// A random JSON value (objects and arrays up to `depth` deep), with escapes, unicode, numbers of every shape.
json random_value(std::mt19937_64& rng, int depth) {
  std::uniform_int_distribution<int> kind(0, depth > 0 ? 7 : 5);
  switch (kind(rng)) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return static_cast<int64_t>(rng() % 2000001) - 1000000;
    case 3: {
      std::uniform_real_distribution<double> d(-1e6, 1e6);
      const double v = d(rng);
      return rng() % 3 == 0 ? v * 1e-30 : v;  // exponents too
    }
    case 4:
    case 5: {
      static const char* pieces[] = {"a", "key", " ", "\"", "\\", "/", "\n", "\t", "\x01", "é", "€", "😀", "{", "]", ","};
      std::string s;
      const int n = static_cast<int>(rng() % 6);
      for (int i = 0; i < n; ++i) s += pieces[rng() % (sizeof(pieces) / sizeof(pieces[0]))];
      return s;
    }
    case 6: {
      json a = json::array();
      const int n = static_cast<int>(rng() % 4);
      for (int i = 0; i < n; ++i) a.push_back(random_value(rng, depth - 1));
      return a;
    }
    default: {
      json o = json::object();
      const int n = static_cast<int>(rng() % 4);
      for (int i = 0; i < n; ++i) {
        std::string key = "k";
        key += static_cast<char>('0' + rng() % 10);
        o[key] = random_value(rng, depth - 1);
      }
      return o;
    }
  }
}

json random_object(std::mt19937_64& rng) {
  json o = json::object();
  const int n = static_cast<int>(rng() % 4);
  for (int i = 0; i < n; ++i) o[std::string(1, static_cast<char>('a' + rng() % 26))] = random_value(rng, 4);
  return o;
}

// Whether the recognizer reads all of s and calls it complete.
bool complete_object(const std::string& s) {
  cm::JsonPrefix p;
  return p.feed(s) && p.complete();
}

// Whether the parser takes s as one object whose whitespace runs stay within the recognizer's bound.
bool parser_object(const std::string& s) {
  // The grammar, not double's range: nlohmann refuses 1E999 (an overflow), JSON's grammar does not. Exponent digits
  // become one 0 for the parser (inside strings the change is harmless: any digits are valid there).
  // And the recognizer takes nothing after the object, not even whitespace (the reply ends there).
  if (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' || s.back() == '\r')) return false;
  std::string t;
  bool quoted = false, escaped = false;
  for (size_t i = 0; i < s.size(); ++i) {
    t += s[i];
    if (quoted) {
      if (escaped) escaped = false;
      else if (s[i] == '\\') escaped = true;
      else if (s[i] == '"') quoted = false;
      continue;
    }
    if (s[i] == '"') quoted = true;
    if ((s[i] != 'e' && s[i] != 'E') || i == 0 || s[i - 1] < '0' || s[i - 1] > '9') continue;
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) t += s[j++];
    const size_t digits = j;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    if (j > digits) t += '0';
    i = j - 1;
  }
  if (!json::accept(t)) return false;
  if (!json::parse(t).is_object()) return false;
  int run = 0;
  bool in_string = false, escape = false;
  for (char c : s) {  // whitespace outside strings, in a row
    if (in_string) {
      if (escape) escape = false;
      else if (c == '\\') escape = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    const bool ws = c == ' ' || c == '\t' || c == '\n' || c == '\r';
    run = ws ? run + 1 : 0;
    if (run > cm::JsonPrefix::kMaxWhitespace) return false;
  }
  return true;
}

TEST(JsonPrefix, EveryPrefixOfAnObjectIsAcceptedAndOnlyTheWholeIsComplete) {
  auto rng = cider::test::make_rng(71);
  for (int t = 0; t < 400; ++t) {
    const json o = random_object(rng);
    for (int indent : {-1, 2}) {
      std::string s = o.dump(indent, ' ', false);  // raw UTF-8 and escapes
      if (t % 3 == 0) s.insert(0, " \n");
      cm::JsonPrefix p;
      for (size_t i = 0; i < s.size(); ++i) {
        ASSERT_TRUE(p.feed(static_cast<uint8_t>(s[i]))) << "byte " << i << " of " << s;
        ASSERT_EQ(p.complete(), i + 1 == s.size()) << "byte " << i << " of " << s;
      }
      cm::JsonPrefix after = p;
      EXPECT_FALSE(after.feed(' ')) << "nothing may follow the object: " << s;
      EXPECT_TRUE(parser_object(s));
    }
  }
}

// Mutations of valid texts (a byte replaced, inserted or deleted, from a JSON-heavy alphabet) and the recognizer's
// verdict on the whole text against the parser's, both ways.
TEST(JsonPrefix, AgreesWithTheParserOnMutatedTexts) {
  auto rng = cider::test::make_rng(72);
  const std::string alphabet = "{}[]\":,.-+eE0123456789 \n\\/utrfaln\x01\xC3\xA9xbz";
  int accepted = 0, refused = 0;
  for (int t = 0; t < 20000; ++t) {
    std::string s = random_object(rng).dump(t % 2 == 0 ? -1 : 1);
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t at = rng() % s.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0: s[at] = c; break;
        case 1: s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), c); break;
        default: s.erase(at, 1); break;
      }
    }
    const bool ours = complete_object(s), theirs = parser_object(s);
    ASSERT_EQ(ours, theirs) << "text: " << s;
    (ours ? accepted : refused) += 1;
  }
  EXPECT_GT(accepted, 1000);  // both outcomes are exercised
  EXPECT_GT(refused, 1000);
}

TEST(JsonPrefix, RefusesWhatNoObjectTextStartsWith) {
  for (const char* bad : {"[", "\"a\"", "1", "{,", "{\"a\" 1", "{\"a\":}", "{\"a\":1,}", "{\"a\":01", "{\"a\":1.}",
                          "{\"a\":-}", "{\"a\":tru1", "{\"a\":\"\\x\"", "{\"a\":\"\x01", "{\"a\":[1,]", "{}}",
                          "{\"a\":\"\\u12G"}) {
    cm::JsonPrefix p;
    EXPECT_FALSE(p.feed(bad)) << bad;
  }
  for (const char* ok : {"{", " {\"", "{\"a\":-0.5e+", "{\"a\":[tr", "{\"a\":{\"b\":[[], {}, \"\\u00e9\", nu"}) {
    cm::JsonPrefix p;
    EXPECT_TRUE(p.feed(ok)) << ok;
    EXPECT_FALSE(p.complete()) << ok;
  }
}

TEST(JsonPrefix, BoundsDepthAndWhitespace) {
  cm::JsonPrefix deep;
  EXPECT_TRUE(deep.feed("{\"a\":"));
  for (int i = 1; i < cm::JsonPrefix::kMaxDepth; ++i) ASSERT_TRUE(deep.feed('[')) << i;
  EXPECT_FALSE(deep.feed('['));
  cm::JsonPrefix ws;
  EXPECT_TRUE(ws.feed("{"));
  for (int i = 0; i < cm::JsonPrefix::kMaxWhitespace; ++i) ASSERT_TRUE(ws.feed(i % 2 ? ' ' : '\n')) << i;
  EXPECT_FALSE(ws.feed(' '));
  cm::JsonPrefix in_string;  // whitespace inside strings is content, not bounded
  EXPECT_TRUE(in_string.feed("{\"" + std::string(200, ' ')));
}

}  // namespace
