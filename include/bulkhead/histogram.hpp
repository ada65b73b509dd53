// bulkhead: a fixed-memory, lock-free log-linear histogram of durations.
//
// Every power of two from 2^sub_bits up is split into 2^sub_bits equal
// buckets; values below 2^sub_bits get a bucket each. A value is therefore
// placed in a bucket whose width is at most 1/2^sub_bits of its lower bound,
// and a quantile reported as the bucket's midpoint is within
// relative_error = 1/2^(sub_bits+1) (3.125 % with sub_bits = 4) of a value
// actually recorded at that rank. Values at or above 2^max_bits land in the
// last bucket (with sub_bits 4 and max_bits 40, nanoseconds up to about 18
// minutes are exact to that bound).
//
// Memory is fixed at construction (an array of counters inside the object):
// recording never allocates, never locks, never syscalls. Histograms of the
// same shape merge by adding counters.
//
// Thread safety: record() may be called from any number of threads at once;
// each counter is a relaxed atomic add. snapshot() reads every counter with
// relaxed loads while writers go on: it is not one atomic cut, so its total
// may miss records made during the copy, but each bucket it reports is a
// value that counter really had (counts only grow).
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace bulkhead {

/// A snapshot of a log_linear_histogram: plain data, mergeable, queryable.
class histogram_snapshot;

/// Lock-free log-linear histogram of non-negative 64-bit values (nanoseconds
/// by convention).
class log_linear_histogram {
public:
    /// Buckets per power of two: 2^sub_bits.
    static constexpr unsigned sub_bits = 4;
    /// Values from 2^max_bits up share the last bucket.
    static constexpr unsigned max_bits = 40;
    /// The number of buckets.
    static constexpr std::size_t bucket_count = (max_bits - sub_bits + 1) * (std::size_t{1} << sub_bits);
    /// Bound on the relative error of a reported quantile (midpoint of its bucket).
    static constexpr double relative_error = 1.0 / static_cast<double>(std::uint64_t{2} << sub_bits);

    log_linear_histogram() = default;
    log_linear_histogram(const log_linear_histogram&) = delete;
    log_linear_histogram& operator=(const log_linear_histogram&) = delete;

    /// Records one value.
    void record(std::uint64_t value) noexcept {
        // relaxed: counters are independent statistics; nothing is ordered by them.
        m_counts[bucket_of(value)].fetch_add(1, std::memory_order_relaxed);
        m_sum.fetch_add(value, std::memory_order_relaxed);
    }

    /// Records a duration in nanoseconds (negative durations count as 0).
    template <class Rep, class Period>
    void record(std::chrono::duration<Rep, Period> elapsed) noexcept {
        const auto nanoseconds = std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count();
        record(nanoseconds > 0 ? static_cast<std::uint64_t>(nanoseconds) : 0U);
    }

    /// A copy of the counters.
    [[nodiscard]] histogram_snapshot snapshot() const noexcept;

    /// The bucket a value falls in.
    [[nodiscard]] static constexpr std::size_t bucket_of(std::uint64_t value) noexcept {
        constexpr std::uint64_t linear = std::uint64_t{1} << sub_bits;
        if (value < linear) {
            return static_cast<std::size_t>(value);
        }
        if (value >= (std::uint64_t{1} << max_bits)) {
            return bucket_count - 1;
        }
        const unsigned magnitude = 63U - static_cast<unsigned>(std::countl_zero(value));  // >= sub_bits
        const std::uint64_t sub = (value >> (magnitude - sub_bits)) & (linear - 1);
        return static_cast<std::size_t>((magnitude - sub_bits + 1) * linear + sub);
    }

    /// The smallest value of bucket `index`.
    [[nodiscard]] static constexpr std::uint64_t lower_bound(std::size_t index) noexcept {
        constexpr std::uint64_t linear = std::uint64_t{1} << sub_bits;
        if (index < linear) {
            return index;
        }
        const std::uint64_t group = index / linear;  // >= 1
        const std::uint64_t sub = index % linear;
        const auto shift = static_cast<unsigned>(group - 1);
        return (linear + sub) << shift;
    }

    /// One past the largest value of bucket `index` (the last bucket is open).
    [[nodiscard]] static constexpr std::uint64_t upper_bound(std::size_t index) noexcept {
        return index + 1 < bucket_count ? lower_bound(index + 1) : std::numeric_limits<std::uint64_t>::max();
    }

private:
    std::array<std::atomic<std::uint64_t>, bucket_count> m_counts{};
    std::atomic<std::uint64_t> m_sum{0};
};

class histogram_snapshot {
public:
    using counts_type = std::array<std::uint64_t, log_linear_histogram::bucket_count>;

    histogram_snapshot() = default;

    /// Samples recorded.
    [[nodiscard]] std::uint64_t count() const noexcept { return m_count; }
    /// The sum of the recorded values (wraps after 2^64 ns, about 584 years of waiting).
    [[nodiscard]] std::uint64_t sum() const noexcept { return m_sum; }
    /// Per-bucket counts.
    [[nodiscard]] const counts_type& counts() const noexcept { return m_counts; }

    /// The value at quantile q in [0, 1]: the midpoint of the bucket holding
    /// rank ceil(q * count); 0 when empty. Within relative_error of a recorded
    /// value of that rank.
    [[nodiscard]] double quantile(double q) const noexcept {
        if (m_count == 0) {
            return 0.0;
        }
        q = q < 0.0 ? 0.0 : (q > 1.0 ? 1.0 : q);
        auto rank = static_cast<std::uint64_t>(q * static_cast<double>(m_count) + 0.999999999);
        rank = rank == 0 ? 1 : rank;
        std::uint64_t seen = 0;
        for (std::size_t i = 0; i < m_counts.size(); ++i) {
            seen += m_counts[i];
            if (seen >= rank) {
                return midpoint(i);
            }
        }
        return midpoint(m_counts.size() - 1);
    }

    /// Samples whose bucket lies entirely at or below `bound`: a cumulative
    /// count for a Prometheus `le` bucket. Samples in the one bucket that
    /// straddles `bound` are not counted (an undercount of at most that
    /// bucket, whose width is within relative_error * 2 of `bound`).
    [[nodiscard]] std::uint64_t count_at_or_below(std::uint64_t bound) const noexcept {
        std::uint64_t total = 0;
        for (std::size_t i = 0; i < m_counts.size(); ++i) {
            if (log_linear_histogram::upper_bound(i) - 1 > bound) {
                break;
            }
            total += m_counts[i];
        }
        return total;
    }

    /// Adds another snapshot's samples.
    void merge(const histogram_snapshot& other) noexcept {
        for (std::size_t i = 0; i < m_counts.size(); ++i) {
            m_counts[i] += other.m_counts[i];
        }
        m_count += other.m_count;
        m_sum += other.m_sum;
    }

private:
    friend class log_linear_histogram;

    static double midpoint(std::size_t index) noexcept {
        const auto low = static_cast<double>(log_linear_histogram::lower_bound(index));
        if (index + 1 >= log_linear_histogram::bucket_count) {
            return low;
        }
        const auto high = static_cast<double>(log_linear_histogram::lower_bound(index + 1));
        return index < (std::size_t{1} << log_linear_histogram::sub_bits) ? low : (low + high - 1.0) / 2.0;
    }

    counts_type m_counts{};
    std::uint64_t m_count = 0;
    std::uint64_t m_sum = 0;
};

inline histogram_snapshot log_linear_histogram::snapshot() const noexcept {
    histogram_snapshot copy;
    for (std::size_t i = 0; i < bucket_count; ++i) {
        copy.m_counts[i] = m_counts[i].load(std::memory_order_relaxed);
        copy.m_count += copy.m_counts[i];
    }
    copy.m_sum = m_sum.load(std::memory_order_relaxed);
    return copy;
}

}  // namespace bulkhead
