// Chat formats. The expected texts are what each family's published chat template (the `chat_template` of its
// tokenizer_config.json, rendered by transformers' apply_chat_template with add_generation_prompt=True) writes for the
// same messages, without the leading BOS (cider adds it when encoding). The template lines that decide each text are
// quoted beside it. Also: pieces appended turn by turn give exactly the whole-conversation text, the architecture and
// vocabulary pick the format, and malformed conversations and unknown names are rejected.
#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/chat_format.h"
#include "support/test_support.h"

namespace cider::model {
namespace {

const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", "  Hi there \n"}, {"assistant", " Hello! "}, {"user", "2+2?"}};

TEST(ChatFormat, ChatMLAsQwenWritesIt) {
  // Qwen2/Qwen3: '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' (contents untouched),
  // generation prompt '<|im_start|>assistant\n'.
  EXPECT_EQ(render_chat(ChatFormat::kChatML, kConversation),
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\n  Hi there \n<|im_end|>\n"
            "<|im_start|>assistant\n Hello! <|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatFormat, Llama3HeadersAsMetaWritesThem) {
  // Llama 3: '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim +
  // '<|eot_id|>', generation prompt '<|start_header_id|>assistant<|end_header_id|>\n\n'.
  EXPECT_EQ(render_chat(ChatFormat::kLlama3, kConversation),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatFormat, GemmaTurnsAsGoogleWritesThem) {
  // Gemma 3: first_user_prefix = messages[0]['content'] + '\n\n'; '<start_of_turn>' + role + '\n' +
  // (first_user_prefix if loop.first) + message['content'] | trim + '<end_of_turn>\n', assistant → "model",
  // generation prompt '<start_of_turn>model\n'.
  EXPECT_EQ(render_chat(ChatFormat::kGemma, kConversation),
            "<start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n"
            "<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\n2+2?<end_of_turn>\n"
            "<start_of_turn>model\n");
}

TEST(ChatFormat, MistralAndLlama2InstBlocks) {
  // Mistral Instruct: '[INST] ' + message['content'] + ' [/INST]', replies message['content'] + eos_token; a system
  // message opens the first user message followed by '\n\n'.
  EXPECT_EQ(render_chat(ChatFormat::kMistral, kConversation),
            "[INST] Be brief.\n\n  Hi there \n [/INST] Hello! </s>[INST] 2+2? [/INST]");
  // Llama 2 chat: content = '<<SYS>>\n' + system + '\n<</SYS>>\n\n' + content for the first message;
  // bos_token + '[INST] ' + content.strip() + ' [/INST]', replies ' ' + content.strip() + ' ' + eos_token.
  EXPECT_EQ(render_chat(ChatFormat::kLlama2, kConversation),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n  Hi there [/INST] Hello! </s><s>[INST] 2+2? [/INST]");
}

TEST(ChatFormat, NoSystemMessageMeansNoSystemBlock) {
  const std::vector<ChatMessage> m = {{"user", "Hi"}};
  EXPECT_EQ(render_chat(ChatFormat::kChatML, m), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_chat(ChatFormat::kLlama3, m),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render_chat(ChatFormat::kGemma, m), "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(render_chat(ChatFormat::kMistral, m), "[INST] Hi [/INST]");
  EXPECT_EQ(render_chat(ChatFormat::kLlama2, m), "[INST] Hi [/INST]");
  EXPECT_EQ(render_chat(ChatFormat::kRaw, m), "Hi\n");
}

TEST(ChatFormat, Phi3AsMicrosoftWritesIt) {
  // Phi-3.5-mini-instruct: {% if message['role'] == 'system' and message['content'] %}'<|system|>\n' + content +
  // '<|end|>\n'; user / assistant alike with '<|user|>\n' / '<|assistant|>\n' (contents untouched); generation
  // prompt '<|assistant|>\n'.
  EXPECT_EQ(render_chat(ChatFormat::kPhi3, kConversation),
            "<|system|>\nBe brief.<|end|>\n"
            "<|user|>\n  Hi there \n<|end|>\n"
            "<|assistant|>\n Hello! <|end|>\n"
            "<|user|>\n2+2?<|end|>\n"
            "<|assistant|>\n");
  EXPECT_EQ(render_chat(ChatFormat::kPhi3, {{"system", ""}, {"user", "Hi"}}), "<|user|>\nHi<|end|>\n<|assistant|>\n");
}

TEST(ChatFormat, TurnByTurnPiecesConcatenateToTheWholeConversation) {
  // What `cider chat` appends: first user turn (with the system text), the reply as generated, the reply end, the
  // next user turn. For formats that keep replies untouched this is exactly render_chat's text.
  for (ChatFormat f : {ChatFormat::kChatML, ChatFormat::kMistral, ChatFormat::kRaw, ChatFormat::kPhi3}) {
    const std::string pieces = chat_user_turn(f, kConversation[1].content, kConversation[0].content, true) +
                               kConversation[2].content + chat_reply_end(f) +
                               chat_user_turn(f, kConversation[3].content, kConversation[0].content, false);
    EXPECT_EQ(pieces, render_chat(f, kConversation)) << chat_format_name(f);
  }
  // Formats that trim past replies: the same once the reply is given as the template writes it.
  for (ChatFormat f : {ChatFormat::kLlama3, ChatFormat::kGemma}) {
    const std::string pieces = chat_user_turn(f, kConversation[1].content, kConversation[0].content, true) +
                               "Hello!" + chat_reply_end(f) + chat_user_turn(f, kConversation[3].content, "", false);
    EXPECT_EQ(pieces, render_chat(f, kConversation)) << chat_format_name(f);
  }
  EXPECT_EQ(chat_user_turn(ChatFormat::kLlama2, "2+2?", "ignored after the first turn", false), "<s>[INST] 2+2? [/INST]");
}

TEST(ChatFormat, EndTokensAreTheFirstTokenOfTheReplyEnd) {
  for (ChatFormat f :
       {ChatFormat::kChatML, ChatFormat::kLlama3, ChatFormat::kGemma, ChatFormat::kMistral, ChatFormat::kPhi3}) {
    const auto ends = chat_end_tokens(f);
    ASSERT_EQ(ends.size(), 1u);
    EXPECT_EQ(chat_reply_end(f).rfind(ends[0], 0), 0u) << chat_format_name(f);
  }
  EXPECT_TRUE(chat_end_tokens(ChatFormat::kRaw).empty());
}

TEST(ChatFormat, ChosenFromTheArchitectureAndTheVocabulary) {
  auto vocab = [](std::vector<std::string> tokens) {
    return [tokens](std::string_view t) { return std::find(tokens.begin(), tokens.end(), t) != tokens.end(); };
  };
  const auto none = vocab({});
  EXPECT_EQ(default_chat_format(Architecture::kQwen2, none), ChatFormat::kChatML);
  EXPECT_EQ(default_chat_format(Architecture::kQwen3, none), ChatFormat::kChatML);
  EXPECT_EQ(default_chat_format(Architecture::kGemma3, none), ChatFormat::kGemma);
  EXPECT_EQ(default_chat_format(Architecture::kMistral, none), ChatFormat::kMistral);
  EXPECT_EQ(default_chat_format(Architecture::kLlama, vocab({"<|begin_of_text|>", "<|start_header_id|>"})),
            ChatFormat::kLlama3);
  EXPECT_EQ(default_chat_format(Architecture::kLlama, vocab({"<|im_start|>", "<|im_end|>"})), ChatFormat::kChatML);
  EXPECT_EQ(default_chat_format(Architecture::kLlama, vocab({"<s>", "</s>"})), ChatFormat::kLlama2);
  EXPECT_EQ(default_chat_format(Architecture::kLlama, vocab({"<|begin_of_text|>", "<|end_of_text|>"})), ChatFormat::kRaw);
}

TEST(ChatFormat, NamesRoundTripAndUnknownNamesAreRejected) {
  for (ChatFormat f : {ChatFormat::kChatML, ChatFormat::kLlama3, ChatFormat::kGemma, ChatFormat::kMistral,
                       ChatFormat::kLlama2, ChatFormat::kRaw, ChatFormat::kPhi3})
    EXPECT_EQ(parse_chat_format(chat_format_name(f)), f);
  try {
    parse_chat_format("jinja");
    FAIL() << "accepted an unknown chat format";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    const std::string m = e.what();
    EXPECT_NE(m.find("[chat_format]"), std::string::npos) << m;
    EXPECT_NE(m.find("got \"jinja\""), std::string::npos) << m;
  }
}

TEST(ChatFormat, MalformedConversationsAreRejected) {
  auto rejects = [](const std::vector<ChatMessage>& m, const std::string& what) {
    try {
      render_chat(ChatFormat::kChatML, m);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  rejects({}, "at least one user message");
  rejects({{"system", "s"}}, "at least one user message");
  rejects({{"assistant", "a"}}, "got role \"assistant\"");
  rejects({{"user", "u"}, {"user", "u"}}, "got role \"user\"");
  rejects({{"user", "u"}, {"assistant", "a"}}, "end with a user message");
  rejects({{"user", "u"}, {"system", "s"}, {"user", "u"}}, "got role \"system\"");
}

}  // namespace
}  // namespace cider::model
