#include "model/chat_format.h"

#include "core/error.h"
#include "model/arch/arch.h"

namespace cider::model {

namespace {

// Jinja's `trim` (Python's str.strip()) on ASCII whitespace, which is what the templates' inputs carry.
std::string trim(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return "";
  const size_t e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
}

std::string cat(std::initializer_list<std::string_view> parts) {
  std::string s;
  for (auto p : parts) s += p;
  return s;
}

// How a past assistant reply is written inside the conversation (before its reply_end).
std::string past_reply(ChatFormat f, std::string_view a) {
  switch (f) {
    case ChatFormat::kLlama3:
    case ChatFormat::kGemma: return trim(a);
    case ChatFormat::kLlama2: return cat({" ", trim(a)});
    default: return std::string(a);
  }
}

}  // namespace

ChatFormat parse_chat_format(std::string_view name) {
  if (name == "chatml") return ChatFormat::kChatML;
  if (name == "llama3") return ChatFormat::kLlama3;
  if (name == "gemma") return ChatFormat::kGemma;
  if (name == "mistral") return ChatFormat::kMistral;
  if (name == "llama2") return ChatFormat::kLlama2;
  if (name == "raw") return ChatFormat::kRaw;
  if (name == "phi3") return ChatFormat::kPhi3;
  fail(ErrorCode::kInvalidArgument, "chat_format", "the chat format must be one of chatml, llama3, gemma, mistral, "
       "llama2, raw, phi3; got \"", name, "\"");
}

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::kChatML: return "chatml";
    case ChatFormat::kLlama3: return "llama3";
    case ChatFormat::kGemma: return "gemma";
    case ChatFormat::kMistral: return "mistral";
    case ChatFormat::kLlama2: return "llama2";
    case ChatFormat::kRaw: return "raw";
    case ChatFormat::kPhi3: return "phi3";
  }
  return "?";
}

ChatFormat default_chat_format(Architecture arch, const std::function<bool(std::string_view)>& has_token) {
  return arch_chat_format(arch_spec(arch), has_token);
}

std::string chat_user_turn(ChatFormat f, std::string_view user, std::string_view system, bool first_turn) {
  const bool sys = first_turn && !system.empty();
  switch (f) {
    case ChatFormat::kChatML:
      return cat({sys ? cat({"<|im_start|>system\n", system, "<|im_end|>\n"}) : "", "<|im_start|>user\n", user,
                  "<|im_end|>\n<|im_start|>assistant\n"});
    case ChatFormat::kLlama3:
      return cat({sys ? cat({"<|start_header_id|>system<|end_header_id|>\n\n", trim(system), "<|eot_id|>"}) : "",
                  "<|start_header_id|>user<|end_header_id|>\n\n", trim(user),
                  "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"});
    case ChatFormat::kGemma:
      return cat({"<start_of_turn>user\n", sys ? cat({system, "\n\n"}) : "", trim(user),
                  "<end_of_turn>\n<start_of_turn>model\n"});
    case ChatFormat::kMistral:
      return cat({"[INST] ", sys ? cat({system, "\n\n"}) : "", user, " [/INST]"});
    case ChatFormat::kLlama2:
      // Every turn after the first opens with its own BOS, written as text (the first one comes from encode).
      return cat({first_turn ? "" : "<s>", "[INST] ",
                  trim(cat({sys ? cat({"<<SYS>>\n", system, "\n<</SYS>>\n\n"}) : "", user})), " [/INST]"});
    case ChatFormat::kRaw:
      return cat({sys ? cat({system, "\n"}) : "", user, "\n"});
    case ChatFormat::kPhi3:
      return cat({sys ? cat({"<|system|>\n", system, "<|end|>\n"}) : "", "<|user|>\n", user,
                  "<|end|>\n<|assistant|>\n"});
  }
  return "";
}

std::string chat_reply_end(ChatFormat f) {
  switch (f) {
    case ChatFormat::kChatML: return "<|im_end|>\n";
    case ChatFormat::kLlama3: return "<|eot_id|>";
    case ChatFormat::kGemma: return "<end_of_turn>\n";
    case ChatFormat::kMistral: return "</s>";
    case ChatFormat::kLlama2: return " </s>";
    case ChatFormat::kRaw: return "\n";
    case ChatFormat::kPhi3: return "<|end|>\n";
  }
  return "";
}

std::vector<std::string> chat_end_tokens(ChatFormat f) {
  switch (f) {
    case ChatFormat::kChatML: return {"<|im_end|>"};
    case ChatFormat::kLlama3: return {"<|eot_id|>"};
    case ChatFormat::kGemma: return {"<end_of_turn>"};
    case ChatFormat::kMistral:
    case ChatFormat::kLlama2: return {"</s>"};
    case ChatFormat::kRaw: return {};
    case ChatFormat::kPhi3: return {"<|end|>"};
  }
  return {};
}

std::string render_chat(ChatFormat f, const std::vector<ChatMessage>& messages) {
  size_t i = 0;
  std::string system;
  if (!messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    i = 1;
  }
  check(i < messages.size(), ErrorCode::kInvalidArgument, "chat_format",
        "a conversation needs at least one user message; got ", messages.size(), " messages");
  std::string out;
  for (bool first = true; i < messages.size(); ++i, first = false) {
    const ChatMessage& u = messages[i];
    check(u.role == "user", ErrorCode::kInvalidArgument, "chat_format", "message ", i,
          " must be a user message (user and assistant alternate, starting with user); got role \"", u.role, "\"");
    out += chat_user_turn(f, u.content, system, first);
    if (i + 1 == messages.size()) break;
    const ChatMessage& a = messages[++i];
    check(a.role == "assistant", ErrorCode::kInvalidArgument, "chat_format", "message ", i,
          " must be an assistant message (user and assistant alternate); got role \"", a.role, "\"");
    check(i + 1 < messages.size(), ErrorCode::kInvalidArgument, "chat_format",
          "the conversation must end with a user message; got an assistant message last (message ", i, ")");
    out += past_reply(f, a.content) + chat_reply_end(f);
  }
  return out;
}

}  // namespace cider::model
