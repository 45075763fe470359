// cider/model/chat_format.h — the prompt formats of the supported chat models, written out by hand (no Jinja engine):
// each renders what the model family's own chat template renders for a conversation.
//
//   chatml  (Qwen2, Qwen3)   <|im_start|>system\n{S}<|im_end|>\n<|im_start|>user\n{U}<|im_end|>\n
//                            <|im_start|>assistant\n{A}<|im_end|>\n ...           (no default system message)
//   llama3  (Llama 3)        <|start_header_id|>system<|end_header_id|>\n\n{S}<|eot_id|>
//                            <|start_header_id|>user<|end_header_id|>\n\n{U}<|eot_id|>
//                            <|start_header_id|>assistant<|end_header_id|>\n\n{A}<|eot_id|> ...   (contents trimmed)
//   gemma   (Gemma 3)        <start_of_turn>user\n{S}\n\n{U}<end_of_turn>\n<start_of_turn>model\n{A}<end_of_turn>\n
//                            (the system text opens the first user turn; contents trimmed)
//   mistral (Mistral)        [INST] {S}\n\n{U} [/INST]{A}</s>[INST] {U2} [/INST] ...
//   llama2  (Llama 2)        [INST] <<SYS>>\n{S}\n<</SYS>>\n\n{U} [/INST] {A} </s><s>[INST] {U2} [/INST] ...
//   raw     (base models)    {U}\n{A}\n{U2}\n ...   (plain continuation, no markers)
//   phi3    (Phi-3, 3.5)     <|system|>\n{S}<|end|>\n<|user|>\n{U}<|end|>\n<|assistant|>\n{A}<|end|>\n ...
// The BOS token is not part of the text: the caller encodes the first piece with add_special = true (which prepends
// BOS where the tokenizer's post-processor does) and later pieces without. Special-token strings in the text
// ("<|im_end|>", "</s>") are matched as special tokens by the tokenizer.
//
// A conversation is rendered from pieces so that `cider chat` can append only each new turn to its session:
//   [user_turn(U1, S, first)] A1 [reply_end] [user_turn(U2, "", later)] A2 [reply_end] ...
// render_chat builds the whole text from the same pieces (and the templates' own treatment of past replies).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "model/model.h"

namespace cider::model {

enum class ChatFormat { kChatML, kLlama3, kGemma, kMistral, kLlama2, kRaw, kPhi3 };

ChatFormat parse_chat_format(std::string_view name);  // the names above; cider::Error (kInvalidArgument) otherwise
const char* chat_format_name(ChatFormat f);

// The format of an architecture, as its registry entry (model/arch/arch.h) gives it. Llama-architecture checkpoints
// differ by generation, so the vocabulary decides: <|start_header_id|> → llama3, <|im_start|> → chatml, <s>/</s> →
// llama2, else raw (a base model without chat markers). `has_token(s)` says whether the tokenizer has s as a token.
ChatFormat default_chat_format(Architecture arch, const std::function<bool(std::string_view)>& has_token);

// Text that opens a user turn and ends with the assistant's header (the generation prompt). `system` (may be empty)
// is used only for the first turn of a conversation.
std::string chat_user_turn(ChatFormat f, std::string_view user, std::string_view system, bool first_turn);

// Text that closes an assistant reply (its first token is the format's end-of-turn token where it has one).
std::string chat_reply_end(ChatFormat f);

// Token strings that end an assistant reply in this format (added to the model's EOS ids by `cider chat`).
std::vector<std::string> chat_end_tokens(ChatFormat f);

struct ChatMessage {
  std::string role;  // "system" (first only), "user", "assistant"
  std::string content;
};

// The whole prompt for a conversation ending with a user message, with the generation prompt: roles must be an
// optional system message, then user and assistant alternating, starting and ending with user. cider::Error
// (kInvalidArgument, op "chat_format") naming the message and its role otherwise.
std::string render_chat(ChatFormat f, const std::vector<ChatMessage>& messages);

}  // namespace cider::model
