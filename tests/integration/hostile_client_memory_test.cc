// A hostile client's memory (tests/integration/hostile_client_util.h): hugetlb and sparse memfds,
// holes punched into a registered one, buffer counts and mapped bytes limited per session, uid and
// node, and an offload larger than the pool.
#include "integration/hostile_client_util.h"

namespace tier::hostile_client_testing {
namespace {

// ---- Finding 2: SIGBUS from a hugetlb memfd ----------------------------------------------------

// A sealed MFD_HUGETLB memfd whose page the client punched out cannot always be faulted back (no
// free huge pages): the daemon's copy into it died of SIGBUS. No seal stops a punch made after
// registration, so tierd does not map hugetlb memfds at all.
TEST(HostileClient, HugetlbMemfdsAreRefusedSoAPunchedPageCannotKillTierd) {
  const uint64_t huge = MeminfoValue("Hugepagesize") << 10;
  int fd = ::memfd_create("hostile-huge", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
  if (fd < 0) GTEST_SKIP() << "this kernel has no hugetlbfs for memfds: " << std::strerror(errno);
  const uint64_t free_pages = MeminfoValue("HugePages_Free");
  if (free_pages < 2 || huge == 0) {
    ::close(fd);
    GTEST_SKIP() << "needs 2 free huge pages (HugePages_Free is " << free_pages
                 << "; e.g. sysctl vm.nr_hugepages=4): without them the mapping is refused "
                    "anyway and the SIGBUS cannot be set up";
  }
  TierdProcess tierd;
  Session hostile(tierd.SessionOptions("hostile"));
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(2 * huge)), 0);
  void* mapped = ::mmap(nullptr, 2 * huge, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  std::memset(mapped, 1, 2 * huge);
  ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  tier_buffer_id id = 0;
  tier_status registered = tier_buffer_register_fd(hostile.get(), fd, 2 * huge, &id);
  EXPECT_EQ(registered, TIER_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tier_last_error()).find("hugetlbfs"), std::string::npos)
      << tier_last_error();
  if (registered == TIER_OK) {
    // What the campaign did next: punch the second page out, take every free huge page, and
    // have the daemon copy into the hole.
    ASSERT_EQ(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                          static_cast<off_t>(huge), static_cast<off_t>(huge)),
              0);
    int hog = ::memfd_create("hog", MFD_CLOEXEC | MFD_HUGETLB);
    uint64_t pages = MeminfoValue("HugePages_Free");
    ASSERT_EQ(::ftruncate(hog, static_cast<off_t>(pages * huge)), 0);
    void* held = ::mmap(nullptr, pages * huge, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_POPULATE, hog, 0);
    HostBuffer source = hostile.AllocHost(huge);
    auto [object, offload] = hostile.Offload(source.id, 0, huge);
    hostile.TryWait(offload, 10000);
    hostile.TryWait(hostile.Reload(object, id, huge, huge), 10000);
    if (held != MAP_FAILED) ::munmap(held, pages * huge);
    ::close(hog);
  }
  ::munmap(mapped, 2 * huge);
  ::close(fd);
  // The daemon is alive and serves.
  Session good(tierd.SessionOptions("good"));
  RoundTrip(good, 4096, 10000, tierd);
  EXPECT_EQ(tierd.StopWithin(20000), 0);
}

// ---- Finding 4: client memory charged to tierd -------------------------------------------------

// Reloads into the holes of a sparse memfd made tierd fault the pages in, charged to its memory
// cgroup (OOM-killed in 1.3 s in a 512 MiB cgroup). A memfd is registered only when populated,
// so its pages are the client's; the library's own host buffers are.
TEST(HostileClient, SparseMemfdsAreRefusedPopulatedOnesAccepted) {
  TierdProcess tierd;
  Session session(tierd.SessionOptions("good"));
  constexpr uint64_t kBytes = 8 << 20;
  int fd = ::memfd_create("sparse", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(::ftruncate(fd, kBytes), 0);
  ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  tier_buffer_id id = 0;
  EXPECT_EQ(tier_buffer_register_fd(session.get(), fd, kBytes, &id), TIER_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tier_last_error()).find("not populated"), std::string::npos)
      << tier_last_error();
  // Populated all but its last page: still refused.
  testing::PopulateMemfd(fd, kBytes - 4096);
  EXPECT_EQ(tier_buffer_register_fd(session.get(), fd, kBytes, &id), TIER_INVALID_ARGUMENT);
  // The populated part alone is fine, and so is the whole of a memfd populated whole. (Once
  // registered, a memfd is sealed against new writable mappings: HolesCannotBePunched... below.)
  EXPECT_EQ(tier_buffer_register_fd(session.get(), fd, kBytes - 4096, &id), TIER_OK);
  ::close(fd);
  int whole = PopulatedMemfd(kBytes);
  EXPECT_EQ(tier_buffer_register_fd(session.get(), whole, kBytes, &id), TIER_OK);
  ::close(whole);
  RoundTrip(session, 1 << 20, 10000, tierd);  // tier_buffer_alloc_host populates its memfds
}

// Issue 30, N1: a populated memfd registered, then holes punched into it: each reload into a hole
// faulted a fresh page in, charged to tierd's memory cgroup (tierd OOM-killed after 416 MiB of
// reloads in a 700 MiB cgroup, the legit client down for 57.8 s). tierd seals the memfd once it
// has mapped it (F_SEAL_FUTURE_WRITE): the punch fails, so every page stays the client's. The
// client's own mapping, made before, works on; tierd maps a memfd once, for every registration.
TEST(HostileClient, HolesCannotBePunchedIntoARegisteredMemfd) {
  TierdProcess tierd;
  Session session(tierd.SessionOptions("good"));
  constexpr uint64_t kBytes = 4 << 20;
  constexpr uint64_t kMiB = 1 << 20;
  int fd = ::memfd_create("punched", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(::ftruncate(fd, kBytes), 0);
  auto* mapped = static_cast<unsigned char*>(
      ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0));
  ASSERT_NE(mapped, MAP_FAILED);
  std::memset(mapped, 0x11, kBytes);
  ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  tier_buffer_id id = 0;
  ASSERT_EQ(tier_buffer_register_fd(session.get(), fd, kBytes, &id), TIER_OK) << tier_last_error();
  // What the campaign did: punch the second MiB out (and the same through the mapping).
  EXPECT_EQ(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, kMiB, kMiB), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(::madvise(mapped + kMiB, kMiB, MADV_REMOVE), -1);
  EXPECT_EQ(::lseek(fd, 0, SEEK_HOLE), static_cast<off_t>(kBytes)) << "a hole was punched";
  // Reloads into it land in the client's pages, seen through the client's mapping.
  HostBuffer source = session.AllocHost(kMiB);
  std::memset(source.data, 0x5a, kMiB);
  auto [object, offload] = session.Offload(source.id, 0, kMiB);
  session.Wait(offload, 10000);
  session.Wait(session.Reload(object, id, kMiB, kMiB), 10000);
  EXPECT_EQ(mapped[kMiB], 0x5a);
  EXPECT_EQ(mapped[2 * kMiB - 1], 0x5a);
  EXPECT_EQ(mapped[0], 0x11);
  // Registered again (by this session or another): tierd's one mapping serves both. A
  // registration longer than that mapping cannot be had.
  Session other(tierd.SessionOptions("other"));
  tier_buffer_id again = 0;
  EXPECT_EQ(tier_buffer_register_fd(other.get(), fd, kMiB, &again), TIER_OK) << tier_last_error();
  // Once no registration of it is left, it cannot be mapped writable any more, and says why.
  ASSERT_EQ(tier_buffer_unregister(session.get(), id), TIER_OK);
  ASSERT_EQ(tier_buffer_unregister(other.get(), again), TIER_OK);
  ASSERT_TRUE(tierd.WaitForStatus([](const v1::GetStatusResponse& s) { return s.buffers() == 1; }))
      << "only the source buffer is left mapped";
  EXPECT_EQ(tier_buffer_register_fd(session.get(), fd, kBytes, &id), TIER_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tier_last_error()).find("register a new memfd"), std::string::npos)
      << tier_last_error();
  ::munmap(mapped, kBytes);
  ::close(fd);
  RoundTrip(session, kMiB, 10000, tierd);
}

// ---- Finding 3: limits on registrations --------------------------------------------------------

// 65 k registrations of a 4 KiB memfd exhausted vm.max_map_count and then tierd itself; a sparse
// 4 TiB memfd registered again and again, its address space. Buffers and mapped bytes are
// limited per session, per uid and (buffers) node-wide, each with an error naming the setting.
TEST(HostileClient, BufferCountsAreLimitedPerSessionUidAndNode) {
  TierdProcess tierd({"--max_buffers_per_session=3", "--max_buffers_per_uid=5",
                      "--max_buffers=6"});
  int fd = PopulatedMemfd(64 << 10);
  Session a(tierd.SessionOptions("a"));
  std::vector<tier_buffer_id> ids(3);
  for (tier_buffer_id& id : ids) ASSERT_EQ(tier_buffer_register_fd(a.get(), fd, 4096, &id), TIER_OK);
  tier_buffer_id extra = 0;
  EXPECT_EQ(tier_buffer_register_fd(a.get(), fd, 4096, &extra), TIER_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::string(tier_last_error()).find("max_buffers_per_session"), std::string::npos)
      << tier_last_error();
  ASSERT_EQ(tier_buffer_unregister(a.get(), ids[0]), TIER_OK);
  EXPECT_EQ(tier_buffer_register_fd(a.get(), fd, 4096, &ids[0]), TIER_OK);

  {
    Session b(tierd.SessionOptions("b"));
    tier_buffer_id id = 0;
    EXPECT_EQ(tier_buffer_register_fd(b.get(), fd, 4096, &id), TIER_OK);
    EXPECT_EQ(tier_buffer_register_fd(b.get(), fd, 4096, &id), TIER_OK);
    EXPECT_EQ(tier_buffer_register_fd(b.get(), fd, 4096, &id), TIER_RESOURCE_EXHAUSTED);
    EXPECT_NE(std::string(tier_last_error()).find("max_buffers_per_uid"), std::string::npos)
        << tier_last_error();
  }
  // b's buffers went with it.
  Session c(tierd.SessionOptions("c"));
  tier_buffer_id id = 0;
  EXPECT_EQ(tier_buffer_register_fd(c.get(), fd, 4096, &id), TIER_OK);
  ::close(fd);
  RoundTrip(c, 4096, 10000, tierd);  // its fifth buffer: still within every limit
}

TEST(HostileClient, NodeWideBufferLimitHoldsAcrossUsers) {
  TierdProcess tierd({"--max_buffers=2"});
  int fd = PopulatedMemfd(4096);
  Session a(tierd.SessionOptions("a"));
  tier_buffer_id id = 0;
  EXPECT_EQ(tier_buffer_register_fd(a.get(), fd, 4096, &id), TIER_OK);
  EXPECT_EQ(tier_buffer_register_fd(a.get(), fd, 4096, &id), TIER_OK);
  EXPECT_EQ(tier_buffer_register_fd(a.get(), fd, 4096, &id), TIER_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::string(tier_last_error()).find("(max_buffers)"), std::string::npos)
      << tier_last_error();
  ::close(fd);
}

TEST(HostileClient, MappedBytesAreLimitedPerSessionAndUid) {
  TierdProcess tierd({"--max_mapped_bytes_per_session=1M", "--max_mapped_bytes_per_uid=3M"});
  int fd = PopulatedMemfd(2 << 20);
  tier_buffer_id id = 0;
  Session a(tierd.SessionOptions("a"));
  EXPECT_EQ(tier_buffer_register_fd(a.get(), fd, 2 << 20, &id), TIER_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::string(tier_last_error()).find("max_mapped_bytes_per_session"), std::string::npos)
      << tier_last_error();
  EXPECT_EQ(tier_buffer_register_fd(a.get(), fd, 1 << 20, &id), TIER_OK);
  EXPECT_EQ(tier_buffer_register_fd(a.get(), fd, 4096, &id), TIER_RESOURCE_EXHAUSTED);
  Session b(tierd.SessionOptions("b"));
  Session c(tierd.SessionOptions("c"));
  EXPECT_EQ(tier_buffer_register_fd(b.get(), fd, 1 << 20, &id), TIER_OK);
  EXPECT_EQ(tier_buffer_register_fd(c.get(), fd, 1 << 20, &id), TIER_OK);
  Session d(tierd.SessionOptions("d"));
  EXPECT_EQ(tier_buffer_register_fd(d.get(), fd, 4096, &id), TIER_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::string(tier_last_error()).find("max_mapped_bytes_per_uid"), std::string::npos)
      << tier_last_error();
  ::close(fd);
}

// Issue 30, N2: one 16 MiB memfd registered 13,890 times, inside every per-session and per-uid
// limit, made 446 MB of page tables in tierd (OOM-killed). max_mapped_bytes bounds what every
// registration of every session maps together (by default a quarter of MemTotal), and status
// counts it.
TEST(HostileClient, MappedBytesAreCappedNodeWideAndCounted) {
  {
    TierdProcess tierd;
    uint64_t mem_total = MeminfoValue("MemTotal") << 10;
    EXPECT_EQ(tierd.Status().max_mapped_bytes(), std::max<uint64_t>(mem_total / 4, 1ull << 30));
  }
  TierdProcess tierd({"--max_mapped_bytes=8M", "--max_mapped_bytes_per_session=1T",
                      "--max_mapped_bytes_per_uid=1T"});
  constexpr uint64_t kBytes = 2 << 20;
  int fd = PopulatedMemfd(kBytes);
  Session a(tierd.SessionOptions("a"));
  Session b(tierd.SessionOptions("b"));
  std::vector<tier_buffer_id> ids(4);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(tier_buffer_register_fd((i < 3 ? a : b).get(), fd, kBytes, &ids[i]), TIER_OK)
        << tier_last_error();
  }
  tier_buffer_id extra = 0;
  EXPECT_EQ(tier_buffer_register_fd(b.get(), fd, kBytes, &extra), TIER_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::string(tier_last_error()).find("(max_mapped_bytes)"), std::string::npos)
      << tier_last_error();
  v1::GetStatusResponse status = tierd.Status();
  EXPECT_EQ(status.client_mapped_bytes(), 4 * kBytes);
  EXPECT_EQ(status.max_mapped_bytes(), 8u << 20);
  // Per session too (tierctl clients --json): a's three, b's one.
  std::map<std::string, uint64_t> mapped;
  const v1::ListSessionsResponse sessions = tierd.Sessions();
  for (const v1::SessionInfo& s : sessions.sessions()) mapped[s.name()] = s.mapped_bytes();
  EXPECT_EQ(mapped["a"], 3 * kBytes);
  EXPECT_EQ(mapped["b"], kBytes);
  ASSERT_EQ(tier_buffer_unregister(a.get(), ids[0]), TIER_OK);
  EXPECT_EQ(tierd.Status().client_mapped_bytes(), 3 * kBytes);
  EXPECT_EQ(tier_buffer_register_fd(b.get(), fd, kBytes, &extra), TIER_OK) << tier_last_error();
  ::close(fd);
}

// ---- Finding 5: one impossible offload ---------------------------------------------------------

// With the NVMe tier on, an offload larger than the host pool (within quota) was parked: every
// later offload of every session queued behind it, the spiller pushed the other sessions'
// objects to NVMe to make room for it, and then failed every waiter. It is refused at once now.
TEST(HostileClient, AnOffloadLargerThanThePoolIsRefusedAtOnce) {
  TierdProcess tierd({"--pool_bytes=16M", "--spill_bytes=64M", "--spill_io=thread_pool"});
  Session good(tierd.SessionOptions("good"));
  HostBuffer small = good.AllocHost(1 << 20);
  std::vector<std::pair<tier_object_id, tier_job_id>> offloads;
  for (int i = 0; i < 4; ++i) offloads.push_back(good.Offload(small.id, 0, 1 << 20));
  for (auto& [object, job] : offloads) good.Wait(job, 10000);

  Session hostile(tierd.SessionOptions("hostile"));
  HostBuffer huge = hostile.AllocHost(24 << 20);
  auto start = std::chrono::steady_clock::now();
  auto [object, job] = hostile.Offload(huge.id, 0, huge.bytes);
  // The good session keeps offloading meanwhile, and nothing waits behind the big one.
  for (int i = 0; i < 4; ++i) good.Wait(good.Offload(small.id, 0, 1 << 20).second, 10000);
  EXPECT_EQ(hostile.TryWait(job, 10000), TIER_RESOURCE_EXHAUSTED);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // Nobody's objects went to NVMe for it.
  EXPECT_EQ(tierd.Status().bytes_spilled(), 0u);
  for (auto& [good_object, good_job] : offloads) {
    good.Wait(good.Reload(good_object, small.id, 0, 1 << 20), 10000);
  }
}

}  // namespace
}  // namespace tier::hostile_client_testing
