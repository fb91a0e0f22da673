// server/ui/ui.h - the page at / (for a browser) and /ui: what the server holds and did,
// live, from GET /v1/status (polled). One HTML file with its script and styles, served
// from the binary: no build step, nothing fetched from elsewhere (page.cpp).
//
//   GET /, HEAD /     a browser (Accept: text/html): the page; any other client: the
//                     JSON that says the server is there (Anthropic's clients check it)
//   GET /ui           the page
//   GET /v1/status    the page's data (behind the API key when one is set: the page
//                     asks for it and sends it as a Bearer token)
#pragma once

#include <string_view>

namespace warmctx::server_detail {

// The page's HTML, script and styles.
std::string_view ui_page_html();

}  // namespace warmctx::server_detail
