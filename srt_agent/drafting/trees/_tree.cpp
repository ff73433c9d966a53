// The compiled token tree: a depth-bounded suffix tree over the stored sequences of one prompt,
// with occurrence counts, path-compressed so memory is O(tokens).
//
// Semantics are those of tree_ref.py (the readable reference the tests compare against): every
// window of length <= max_depth of every stored sequence is counted, count(path) = number of
// occurrences of the token string `path`.
//
// Representation. Tokens are stored once, per sequence. A node owns an edge: a span
// (seq, off, len) of some occurrence of its tokens. Every position on an edge has the same count
// and no branching, so an edge is a chain of reference-trie nodes folded into one. Children are a
// doubly linked sibling list; nodes with many children also index them in a hash table.
//
// Streaming insert. Each open sequence keeps one cursor per live suffix (its last max_depth - 1
// start positions), always sitting at the end of a node's edge. Appending a token advances every
// cursor by one token: O(max_depth) per token, O(1) amortized per cursor via four moves:
//   grow   the cursor's node is a leaf only this occurrence has reached: lengthen its edge;
//   new    no child starts with the token: add a leaf pointing at this occurrence;
//   shift  the cursor's node would merge with its only child's first token: move the boundary;
//   split  otherwise peel the child's first token into its own node (count + 1);
// and a one-token child whose count catches up with its single-child parent absorbs the parent.
// The node a cursor sits on is never removed: a removed node's count equals its child's, so no
// occurrence ends there.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <queue>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace py = pybind11;

namespace {

constexpr int32_t kNone = -1;
constexpr int32_t kRoot = 0;
constexpr int kWideChildren = 8;  // nodes with this many children index them in the hash table
constexpr int64_t kMaxToken = 2147483647LL;

struct Node {
    int32_t seq = kNone;  // the edge's tokens are seqs[seq][off, off + len)
    int32_t off = 0;
    int32_t count = 0;    // occurrences of the path to (any position on) this edge
    int32_t first = 0;    // the edge's first token (kept with the node so a child scan reads no sequence)
    int32_t parent = kNone;
    int32_t first_child = kNone;
    int32_t next = kNone;  // siblings
    int32_t prev = kNone;
    uint16_t len = 0;
    uint16_t wide = 0;     // children are also in the hash table
};

// Open-addressing map (node, token) -> child for wide nodes. Entries are never removed: the
// children of a node only ever get replaced (same first token), never dropped.
class ChildIndex {
public:
    int32_t find(int32_t node, int32_t tok) const {
        if (keys_.empty()) return kNone;
        uint64_t key = pack(node, tok);
        for (size_t i = slot(key);; i = (i + 1) & mask_) {
            if (keys_[i] == kEmpty) return kNone;
            if (keys_[i] == key) return vals_[i];
        }
    }
    void put(int32_t node, int32_t tok, int32_t child) {
        if ((size_ + 1) * 4 > keys_.size() * 3) grow();
        uint64_t key = pack(node, tok);
        for (size_t i = slot(key);; i = (i + 1) & mask_) {
            if (keys_[i] == kEmpty) {
                keys_[i] = key;
                vals_[i] = child;
                ++size_;
                return;
            }
            if (keys_[i] == key) {
                vals_[i] = child;
                return;
            }
        }
    }
    size_t nbytes() const { return keys_.capacity() * sizeof(uint64_t) + vals_.capacity() * sizeof(int32_t); }

private:
    static constexpr uint64_t kEmpty = ~0ULL;
    static uint64_t pack(int32_t node, int32_t tok) { return (uint64_t(uint32_t(node)) << 32) | uint32_t(tok); }
    size_t slot(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ULL) >> 20) & mask_; }
    void grow() {
        std::vector<uint64_t> keys = std::move(keys_);
        std::vector<int32_t> vals = std::move(vals_);
        size_t cap = keys.empty() ? 64 : keys.size() * 2;
        keys_.assign(cap, kEmpty);
        vals_.assign(cap, kNone);
        mask_ = cap - 1;
        size_ = 0;
        for (size_t i = 0; i < keys.size(); ++i)
            if (keys[i] != kEmpty) put(int32_t(keys[i] >> 32), int32_t(uint32_t(keys[i])), vals[i]);
    }
    std::vector<uint64_t> keys_;
    std::vector<int32_t> vals_;
    size_t mask_ = 0;
    size_t size_ = 0;
};

struct Position {  // `k` tokens into the edge of `node` (k == len: at the node's end)
    int32_t node = kNone;
    int32_t k = 0;
};

struct Candidate {  // a draft node waiting in the best-first queue
    double score;
    int64_t order;
    int32_t parent;
    Position pos;
    bool operator<(const Candidate& o) const {  // std::priority_queue pops the largest
        if (score != o.score) return score < o.score;
        return order > o.order;
    }
};

std::vector<int32_t> checked_tokens(const std::vector<int64_t>& tokens, const char* what) {
    std::vector<int32_t> out(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] < 0 || tokens[i] > kMaxToken)
            throw py::value_error(std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(tokens[i]) +
                                  " is out of range [0, 2147483647]");
        out[i] = int32_t(tokens[i]);
    }
    return out;
}

class TokenTree {
public:
    explicit TokenTree(int max_depth) : max_depth_(max_depth) {
        if (max_depth < 1 || max_depth > 65535) throw py::value_error("max_depth must be in [1, 65535]");
        nodes_.emplace_back();  // the root: empty edge, count = number of tokens
    }

    int max_depth() const { return max_depth_; }
    int64_t num_nodes() const { return int64_t(nodes_.size() - free_.size()); }
    int64_t num_tokens() const { return nodes_[kRoot].count; }
    int64_t num_sequences() const { return int64_t(seqs_.size()); }

    // Allocated bytes: node slots, free list, child index, sequence tokens and live cursors. O(1).
    int64_t nbytes() const {
        size_t total = nodes_.capacity() * sizeof(Node) + free_.capacity() * sizeof(int32_t) + index_.nbytes();
        total += seqs_.capacity() * (2 * sizeof(std::vector<int32_t>) + 1) + sequence_bytes_;
        return int64_t(total);
    }

    int add_sequence() {
        seqs_.emplace_back();
        cursors_.emplace_back();
        open_.push_back(1);
        return int(seqs_.size() - 1);
    }

    bool is_open(int seq) const { return valid(seq) && open_[seq]; }

    void close(int seq) {
        require_open(seq);
        size_t before = held_bytes(seq);
        open_[seq] = 0;
        std::vector<int32_t>().swap(cursors_[seq]);
        seqs_[seq].shrink_to_fit();
        sequence_bytes_ = sequence_bytes_ - before + held_bytes(seq);
    }

    std::vector<int32_t> sequence(int seq, int64_t start) const {
        require_valid(seq);
        const std::vector<int32_t>& tokens = seqs_[seq];
        auto from = tokens.begin() + std::min<int64_t>(std::max<int64_t>(start, 0), int64_t(tokens.size()));
        return std::vector<int32_t>(from, tokens.end());
    }

    int64_t sequence_length(int seq) const {
        require_valid(seq);
        return int64_t(seqs_[seq].size());
    }

    void extend(int seq, const std::vector<int64_t>& raw) {
        require_open(seq);
        std::vector<int32_t> tokens = checked_tokens(raw, "token_ids");  // all checked before any change
        size_t before = held_bytes(seq);
        for (int32_t tok : tokens) append(seq, tok);
        sequence_bytes_ = sequence_bytes_ - before + held_bytes(seq);
    }

    // Append tokens[0, n) (already checked) to open sequence `seq`.
    void extend_checked(int seq, const int64_t* tokens, int64_t n) {
        size_t before = held_bytes(seq);
        for (int64_t i = 0; i < n; ++i) append(seq, int32_t(tokens[i]));
        sequence_bytes_ = sequence_bytes_ - before + held_bytes(seq);
    }

    int64_t count(const std::vector<int64_t>& raw) const {
        std::vector<int32_t> path = checked_tokens(raw, "path");
        if (path.empty() || int(path.size()) > max_depth_) return 0;
        Position pos = walk(path.data(), path.data() + path.size());
        return pos.node == kNone ? 0 : nodes_[pos.node].count;
    }

    int match(const std::vector<int64_t>& raw, int max_match) const {
        std::vector<int32_t> context = checked_tokens(raw, "context");
        return find_match(context, max_match).second;
    }

    py::tuple draft(const std::vector<int64_t>& raw, int budget, int max_match, bool chain, double min_prob,
                    int seq) const {
        std::vector<int32_t> context = checked_tokens(raw, "context");
        std::vector<int32_t> tokens, parents;
        std::vector<double> scores;
        auto [start, match_len] = find_match(context, max_match, seq);
        if (start.node != kNone && budget > 0) expand(start, budget, chain, min_prob, tokens, parents, scores);
        if (tokens.empty()) match_len = 0;
        return py::make_tuple(tokens, parents, scores, match_len);
    }

    // Structural self-check for tests: links, counts, depths, edge tokens and the child index.
    void validate() const {
        std::vector<int> depth(nodes_.size(), -1);
        std::vector<int32_t> stack{kRoot};
        depth[kRoot] = 0;
        int64_t seen = 0;
        while (!stack.empty()) {
            int32_t n = stack.back();
            stack.pop_back();
            ++seen;
            const Node& node = nodes_[n];
            int64_t child_total = 0;
            int children = 0;
            int32_t prev = kNone;
            for (int32_t c = node.first_child; c != kNone; prev = c, c = nodes_[c].next) {
                const Node& ch = nodes_[c];
                fail_if(ch.parent != n || ch.prev != prev, "broken child links", c);
                fail_if(ch.len < 1 || ch.count < 1, "empty edge or zero count", c);
                fail_if(ch.off < 0 || size_t(ch.off) + ch.len > seqs_[ch.seq].size(), "edge outside its sequence", c);
                fail_if(ch.first != seqs_[ch.seq][ch.off], "first token out of date", c);
                fail_if(node.wide && index_.find(n, first_token(ch)) != c, "child index out of date", c);
                fail_if(n != kRoot && ch.count > node.count, "child counted more than its parent", c);
                depth[c] = depth[n] + ch.len;
                fail_if(depth[c] > max_depth_, "path longer than max_depth", c);
                child_total += ch.count;
                ++children;
                stack.push_back(c);
            }
            fail_if(n != kRoot && child_total > node.count, "children counted more than their parent", n);
            fail_if(children >= kWideChildren && !node.wide, "wide node without index", n);
            for (int32_t c = node.first_child; c != kNone; c = nodes_[c].next)
                for (int32_t d = nodes_[c].next; d != kNone; d = nodes_[d].next)
                    fail_if(first_token(nodes_[c]) == first_token(nodes_[d]), "two children start with the same token", n);
        }
        fail_if(seen != num_nodes(), "unreachable live nodes", kRoot);
    }

private:
    bool valid(int seq) const { return seq >= 0 && size_t(seq) < seqs_.size(); }

    size_t held_bytes(int seq) const { return (seqs_[seq].capacity() + cursors_[seq].capacity()) * sizeof(int32_t); }

    void require_valid(int seq) const {
        if (!valid(seq)) throw py::value_error("sequence " + std::to_string(seq) + " does not exist in this tree");
    }

    void require_open(int seq) const {
        if (!is_open(seq)) throw py::value_error("sequence " + std::to_string(seq) + " is not open in this tree");
    }

    static void fail_if(bool bad, const char* what, int32_t node) {
        if (bad) throw std::runtime_error(std::string("token tree invariant broken at node ") + std::to_string(node) +
                                          ": " + what);
    }

    int32_t token_at(const Node& n, int32_t k) const { return seqs_[n.seq][n.off + k]; }
    static int32_t first_token(const Node& n) { return n.first; }

    void append(int32_t seq, int32_t tok) {
        std::vector<int32_t>& tokens = seqs_[seq];
        std::vector<int32_t>& cursors = cursors_[seq];  // oldest (deepest) first
        int32_t pos = int32_t(tokens.size());
        tokens.push_back(tok);
        nodes_[kRoot].count += 1;
        cursors.push_back(kRoot);
        for (int32_t& cur : cursors) cur = advance(cur, seq, pos, tok);
        if (int(cursors.size()) >= max_depth_) cursors.erase(cursors.begin());  // that window is full
    }

    // Move the cursor at the end of node n (our occurrence ends at `pos`) over token `tok`.
    int32_t advance(int32_t n, int32_t seq, int32_t pos, int32_t tok) {
        {
            Node& N = nodes_[n];
            if (n != kRoot && N.count == 1 && N.seq == seq && N.off + N.len == pos) {  // grow
                N.len += 1;
                return n;
            }
        }
        int32_t c = find_child(n, tok);
        if (c == kNone) {  // new
            c = new_node(seq, pos, 1, 1);
            add_child(n, c);
            return c;
        }
        if (nodes_[c].len > 1) {
            Node& N = nodes_[n];
            Node& C = nodes_[c];
            if (n != kRoot && N.count == C.count + 1 && N.first_child == c && C.next == kNone) {  // shift
                N.seq = seq;
                N.off = pos - N.len;
                N.len += 1;
                C.off += 1;
                C.len -= 1;
                C.first = token_at(C, 0);
                return n;
            }
            int32_t u = new_node(C.seq, C.off, 1, C.count + 1);  // split (C may move: re-fetch)
            replace_child(n, c, u);
            Node& B = nodes_[c];
            B.off += 1;
            B.len -= 1;
            B.first = token_at(B, 0);
            B.parent = u;
            B.prev = B.next = kNone;
            nodes_[u].first_child = c;
            return u;
        }
        Node& C = nodes_[c];
        C.count += 1;
        Node& N = nodes_[n];
        if (n != kRoot && N.count == C.count && N.first_child == c && C.next == kNone) {  // c absorbs n
            C.seq = seq;
            C.off = pos - N.len;
            C.first = N.first;
            C.len = uint16_t(N.len + 1);
            replace_child(N.parent, n, c);
            release(n);
        }
        return c;
    }

    int32_t new_node(int32_t seq, int32_t off, int len, int32_t count) {
        int32_t id;
        if (!free_.empty()) {
            id = free_.back();
            free_.pop_back();
            nodes_[id] = Node();
        } else {
            id = int32_t(nodes_.size());
            if (nodes_.size() == nodes_.capacity())  // grow by 1/4, not 2x: at most 25% idle slots
                nodes_.reserve(std::max<size_t>(64, nodes_.capacity() + nodes_.capacity() / 4));
            nodes_.emplace_back();
        }
        Node& n = nodes_[id];
        n.seq = seq;
        n.off = off;
        n.first = seqs_[seq][off];
        n.len = uint16_t(len);
        n.count = count;
        return id;
    }

    void release(int32_t n) {
        nodes_[n] = Node();
        free_.push_back(n);
    }

    int32_t find_child(int32_t n, int32_t tok) const {
        const Node& node = nodes_[n];
        if (node.wide) return index_.find(n, tok);
        for (int32_t c = node.first_child; c != kNone; c = nodes_[c].next)
            if (first_token(nodes_[c]) == tok) return c;
        return kNone;
    }

    void add_child(int32_t n, int32_t c) {
        Node& node = nodes_[n];
        Node& child = nodes_[c];
        child.parent = n;
        child.prev = kNone;
        child.next = node.first_child;
        if (node.first_child != kNone) nodes_[node.first_child].prev = c;
        node.first_child = c;
        if (node.wide) {
            index_.put(n, first_token(child), c);
            return;
        }
        int children = 0;
        for (int32_t k = node.first_child; k != kNone; k = nodes_[k].next) ++children;
        if (children >= kWideChildren) {
            node.wide = 1;
            for (int32_t k = node.first_child; k != kNone; k = nodes_[k].next) index_.put(n, first_token(nodes_[k]), k);
        }
    }

    // `fresh` takes `old`'s place among n's children (both start with the same token).
    void replace_child(int32_t n, int32_t old, int32_t fresh) {
        Node& o = nodes_[old];
        Node& f = nodes_[fresh];
        f.parent = n;
        f.prev = o.prev;
        f.next = o.next;
        if (o.prev != kNone) nodes_[o.prev].next = fresh;
        else nodes_[n].first_child = fresh;
        if (o.next != kNone) nodes_[o.next].prev = fresh;
        if (nodes_[n].wide) index_.put(n, first_token(f), fresh);
    }

    // The position reached by walking `path` down from the root, or node kNone.
    Position walk(const int32_t* begin, const int32_t* end) const {
        Position pos{kRoot, 0};
        for (const int32_t* t = begin; t != end; ++t) {
            const Node& n = nodes_[pos.node];
            if (pos.k < n.len) {
                if (token_at(n, pos.k) != *t) return Position{};
                ++pos.k;
            } else {
                int32_t c = find_child(pos.node, *t);
                if (c == kNone) return Position{};
                pos = Position{c, 1};
            }
        }
        return pos;
    }

    bool has_continuation(Position pos) const {
        const Node& n = nodes_[pos.node];
        return pos.k < n.len || n.first_child != kNone;
    }

    // Longest context suffix (<= max_match tokens) whose position has a continuation. When the
    // context ends like open sequence `seq`, its cursors already sit on every suffix: O(max_match).
    // Otherwise binary search for the longest suffix that occurs (occurrence is downward closed),
    // then step down to the first one with a continuation.
    std::pair<Position, int> find_match(const std::vector<int32_t>& context, int max_match, int seq = kNone) const {
        int n = int(context.size());
        int longest = std::min({n, max_match, max_depth_ - 1});
        if (longest <= 0) return {Position{}, 0};
        const int32_t* end = context.data() + n;
        if (is_open(seq) && seqs_[seq].size() >= size_t(longest) &&
            std::equal(end - longest, end, seqs_[seq].end() - longest)) {
            const std::vector<int32_t>& cursors = cursors_[seq];  // cursors[size - L] has depth L
            for (int len = longest; len >= 1; --len) {
                int32_t node = cursors[cursors.size() - len];
                if (nodes_[node].first_child != kNone) return {Position{node, nodes_[node].len}, len};
            }
            return {Position{}, 0};
        }
        int lo = 0, hi = longest;
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (walk(end - mid, end).node != kNone) lo = mid;
            else hi = mid - 1;
        }
        for (int len = lo; len >= 1; --len) {
            Position pos = walk(end - len, end);
            if (has_continuation(pos)) return {pos, len};
        }
        return {Position{}, 0};
    }

    // Best-first growth of the draft tree from `start`, by path probability.
    void expand(Position start, int budget, bool chain, double min_prob, std::vector<int32_t>& tokens,
                std::vector<int32_t>& parents, std::vector<double>& scores) const {
        std::priority_queue<Candidate> queue;
        int64_t order = 0;
        std::vector<int32_t> kids;
        auto push_next = [&](Position pos, int32_t index, double score, int room) {
            if (room <= 0) return;
            const Node& n = nodes_[pos.node];
            if (pos.k < n.len) {  // inside an edge: the only continuation, probability 1
                if (score >= min_prob) queue.push(Candidate{score, order++, index, Position{pos.node, pos.k + 1}});
                return;
            }
            kids.clear();
            double continued = 0;  // occurrences followed by a token (not those that end here, e.g. the drafting sequence's own)
            for (int32_t c = n.first_child; c != kNone; c = nodes_[c].next) {
                kids.push_back(c);
                continued += nodes_[c].count;
            }
            auto better = [&](int32_t a, int32_t b) {
                const Node& x = nodes_[a];
                const Node& y = nodes_[b];
                return x.count != y.count ? x.count > y.count : first_token(x) < first_token(y);
            };
            size_t take = std::min(kids.size(), size_t(chain ? 1 : room));
            std::partial_sort(kids.begin(), kids.begin() + take, kids.end(), better);
            for (size_t i = 0; i < take; ++i) {
                const Node& c = nodes_[kids[i]];
                double s = score * (double(c.count) / continued);
                if (s < min_prob) break;
                queue.push(Candidate{s, order++, index, Position{kids[i], 1}});
            }
        };
        push_next(start, -1, 1.0, budget);
        while (!queue.empty() && int(tokens.size()) < budget) {
            Candidate best = queue.top();
            queue.pop();
            tokens.push_back(token_at(nodes_[best.pos.node], best.pos.k - 1));
            parents.push_back(best.parent);
            scores.push_back(best.score);
            push_next(best.pos, int32_t(tokens.size() - 1), best.score, budget - int(tokens.size()));
        }
    }

    int max_depth_;
    std::vector<Node> nodes_;
    std::vector<int32_t> free_;
    ChildIndex index_;
    std::vector<std::vector<int32_t>> seqs_;
    std::vector<std::vector<int32_t>> cursors_;
    std::vector<uint8_t> open_;
    size_t sequence_bytes_ = 0;  // tokens and cursors of all sequences (capacity)
};

using IntArray = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// Rows `start` on of a batch: row r appends tokens[offsets[r], offsets[r + 1]) to sequence seqs[r] of
// trees[r] (None: the row stores nothing). Everything is checked before anything changes. Stops after the
// first row whose tree passes `max_nodes` nodes or after which `nbytes` (the callers' running total, moved
// by each tree's change) passes `max_bytes`: returns (that row, or the row count, and the total).
py::tuple extend_rows(py::sequence trees, IntArray seqs, IntArray tokens, IntArray offsets, int64_t start,
                      int64_t max_nodes, int64_t nbytes, int64_t max_bytes) {
    int64_t rows = int64_t(py::len(trees));
    if (seqs.size() != rows || offsets.size() != rows + 1) throw py::value_error("need one seq and offset per row");
    const int64_t* seq = seqs.data();
    const int64_t* off = offsets.data();
    const int64_t* tok = tokens.data();
    std::vector<TokenTree*> tree(size_t(rows), nullptr);
    for (int64_t r = start; r < rows; ++r) {
        py::handle t = trees[size_t(r)];
        if (!t.is_none()) tree[size_t(r)] = t.cast<TokenTree*>();
        if (off[r] < 0 || off[r] > off[r + 1] || off[r + 1] > tokens.size()) throw py::value_error("bad offsets");
        if (tree[size_t(r)] != nullptr && !tree[size_t(r)]->is_open(int(seq[r])))
            throw py::value_error("sequence " + std::to_string(seq[r]) + " is not open in this tree");
        for (int64_t i = off[r]; i < off[r + 1]; ++i)
            if (tok[i] < 0 || tok[i] > kMaxToken)
                throw py::value_error("token_ids[" + std::to_string(i) + "] = " + std::to_string(tok[i]) +
                                      " is out of range [0, 2147483647]");
    }
    for (int64_t r = start; r < rows; ++r) {
        TokenTree* t = tree[size_t(r)];
        if (t == nullptr) continue;
        int64_t before = t->nbytes();
        t->extend_checked(int(seq[r]), tok + off[r], off[r + 1] - off[r]);
        nbytes += t->nbytes() - before;
        if (t->num_nodes() > max_nodes || nbytes > max_bytes) return py::make_tuple(r, nbytes);
    }
    return py::make_tuple(rows, nbytes);
}

}  // namespace

PYBIND11_MODULE(_tree, m) {
    m.doc() = "Compiled path-compressed token tree (see tree_ref.py for the reference semantics).";
    py::class_<TokenTree>(m, "TokenTree")
        .def(py::init<int>(), py::arg("max_depth") = 64)
        .def_property_readonly_static("backend", [](py::object) { return "compiled"; })
        .def_property_readonly("max_depth", &TokenTree::max_depth)
        .def_property_readonly("num_nodes", &TokenTree::num_nodes)
        .def_property_readonly("num_tokens", &TokenTree::num_tokens)
        .def_property_readonly("num_sequences", &TokenTree::num_sequences)
        .def_property_readonly("nbytes", &TokenTree::nbytes)
        .def("add_sequence", &TokenTree::add_sequence, "Open a new (empty) sequence and return its id.")
        .def("extend", &TokenTree::extend, py::arg("seq"), py::arg("tokens"),
             "Append tokens to open sequence `seq`, counting every new window.")
        .def("close", &TokenTree::close, py::arg("seq"), "Mark `seq` finished.")
        .def("is_open", &TokenTree::is_open, py::arg("seq"))
        .def("sequence", &TokenTree::sequence, py::arg("seq"), py::arg("start") = 0,
             "The tokens of sequence `seq` from position `start` on.")
        .def("sequence_length", &TokenTree::sequence_length, py::arg("seq"))
        .def("count", &TokenTree::count, py::arg("path"), "Occurrences of the token string `path`.")
        .def("match", &TokenTree::match, py::arg("context"), py::arg("max_match"))
        .def("draft", &TokenTree::draft, py::arg("context"), py::arg("budget"), py::arg("max_match"),
             py::arg("chain") = false, py::arg("min_prob") = 0.0, py::arg("seq") = -1,
             "Best-first draft tree: (tokens, parents, scores, match_len). `seq`: an open sequence the\n"
             "context may end like (a shortcut for the match; the result is the same).")
        .def("validate", &TokenTree::validate, "Check the structural invariants; raises RuntimeError if broken.");
    m.def("extend_rows", &extend_rows, py::arg("trees"), py::arg("seqs"), py::arg("tokens"), py::arg("offsets"),
          py::arg("start"), py::arg("max_nodes"), py::arg("nbytes"), py::arg("max_bytes"),
          "A batch's appends, one row per (tree, sequence), in one call: see tree_batch.py.");
}
