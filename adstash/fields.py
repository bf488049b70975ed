"""condor_adstash's attribute tables, kept as data (HTCondor src/condor_scripts/adstash/convert.py).

Which job-ad attribute becomes which Elasticsearch type. The lists are the ones whose sizes
REFERENCE.md records (74 indexed keywords, 57 non-indexed, 8 floats, 136 ints, 63 booleans,
5 nested, 42 ignored, 38 dates); REQUIRED is the newer adstash's projection (ad_converters/job.py).
"""
from __future__ import annotations


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


REQUIRED = _names("""ClusterId CompletionDate EnteredCurrentStatus GlobalJobId JobStatus
    JobUniverse LastRemoteHost MyType ProcId RemoteHost""")

TEXT: frozenset[str] = frozenset()  # full-text search: none by default

INDEXED_KEYWORD = _names("""AccountingGroup AcctGroup AcctGroupUser AssignedGPUs AutoClusterId
    AWSRegion BatchProject BatchQueue CloudLabelNames ConcurrencyLimits CondorPlatform
    CondorVersion CUDAVersion DAGNodeName DAGParentNodeNames DockerImage FileSystemDomain
    GLIDEIN_Entry_Name GlideinClient GlideinEntryName GlideinFactory GlideinFrontendName
    GlideinName GlobalJobId GridJobId GridJobStatus GridResource HoldKillSig JobBatchName
    JobDescription JobKeyword JobState KillSig LastRemoteHost LastRemotePool
    MATCH_EXP_JOBGLIDEIN_ResourceName MATCH_EXP_JOB_GLIDECLIENT_Name
    MATCH_EXP_JOB_GLIDEIN_ClusterId MATCH_EXP_JOB_GLIDEIN_Entry_Name
    MATCH_EXP_JOB_GLIDEIN_Factory MATCH_EXP_JOB_GLIDEIN_Name MATCH_EXP_JOB_GLIDEIN_SEs
    MATCH_EXP_JOB_GLIDEIN_Schedd MATCH_EXP_JOB_GLIDEIN_Site MATCH_EXP_JOB_GLIDEIN_SiteWMS
    MATCH_EXP_JOB_GLIDEIN_SiteWMS_JobId MATCH_EXP_JOB_GLIDEIN_SiteWMS_Queue
    MATCH_EXP_JOB_GLIDEIN_SiteWMS_Slot MyType NTDomain OAuthServicesNeeded Owner ProjectName
    RemoteHost RemotePool RemoveKillSig ScheddName ShouldTransferFiles SingularityImage
    StartdName StartdSlot Status SubmitterGlobalJobId SubmitterGroup SubmitterNegotiatingGroup
    TargetType Universe User WhenToTransferOutput x509UserProxyEmail x509UserProxyFQAN
    x509UserProxyFirstFQAN x509UserProxySubject x509UserProxyVOName""")

NOINDEX_KEYWORD = _names("""AllRemoteHosts AppendFiles Args Arguments Cmd CompressFiles
    ContainerServiceNames DAGManNodesLog DAGManNodesMask DontEncryptInputFiles
    DontEncryptOutputFiles EncryptInputFiles EncryptOutputFiles Err ExitReason FetchFiles
    FileRemaps HoldReason In Iwd JOBGLIDEIN_ResourceName LastHoldReason LastRejMatchReason
    LocalFiles ManifestDir NotifyUser OnExitHoldReason OnExitRemoveReason
    OtherJobRemoveRequirements Out OutputDestination PeriodicHoldReason PeriodicReleaseReason
    PeriodicRemoveReason PostCmd PreCmd PublicInputFiles ReleaseReason RemoteIwd RemoveReason
    Requirements RootDir StartdIpAddr StartdPrincipal StarterIpAddr StarterPrincipal
    SubmitEventNotes SubmitEventUserNotes TransferCheckpoint TransferInput TransferInputRemaps
    TransferIntermediate TransferOutput TransferOutputRemaps TransferPlugins UserLog
    UserLogFile""")

FLOAT = _names("""CPUsUsage GPUsAverageUsage GPUsMemoryUsage JobBatchId JobDuration
    NetworkInputMb NetworkOutputMb Rank""")

INT = _names("""AutoClusterId BatchRuntime BlockReadKbytes BlockReads BlockWriteKbytes
    BlockWrites BufferBlockSize BufferSize BytesRecvd BytesSent ClusterId CommittedSlotTime
    CommittedSuspensionTime CommittedTime CoreSize CpusProvisioned CumulativeRemoteSysCpu
    CumulativeRemoteUserCpu CumulativeSlotTime CumulativeSuspensionTime CumulativeTransferTime
    CurrentHosts DAGManJobId DataLocationsCount DelegatedProxyExpiration DiskProvisioned
    DiskUsage DiskUsage_RAW ErrSize ExecutableSize ExecutableSize_RAW ExitCode ExitSignal
    ExitStatus GpusProvisioned HoldReasonCode HoldReasonSubCode ImageSize ImageSize_RAW IOWait
    JobLeaseDuration JobMaxRetries JobMaxVacateTime JobPid JobPrio JobRunCount JobStatus
    JobSuccessExitCode JobUniverse KeepClaimIdle KillSigTimeout LastHoldReasonCode
    LastHoldReasonSubCode LastJobStatus LocalSysCpu LocalUserCpu MachineAttrCpus0
    MachineAttrSlotWeight0 MachineCount MATCH_EXP_JOB_GLIDEIN_Job_Max_Time
    MATCH_EXP_JOB_GLIDEIN_MaxMemMBs MATCH_EXP_JOB_GLIDEIN_Max_Walltime
    MATCH_EXP_JOB_GLIDEIN_Memory MATCH_EXP_JOB_GLIDEIN_ProcId MATCH_EXP_JOB_GLIDEIN_ToDie
    MATCH_EXP_JOB_GLIDEIN_ToRetire MaxHosts MaxJobRetirementTime MaxTransferInputMB
    MaxTransferOutputMB MaxWallTimeMins MaxWallTimeMins_RAW MemoryProvisioned MemoryUsage
    MinHosts NextJobStartDelay NoopJobExitCode NoopJobExitSignal NumCkpts NumCkpts_RAW
    NumJobCompletions NumJobMatches NumJobReconnects NumJobStarts NumPids NumRestarts
    NumShadowExceptions NumShadowStarts NumSystemHolds OnExitHoldSubCode OrigMaxHosts OutSize
    PeriodicHoldSubCode PilotRestLifeTimeMins PostCmdExitCode PostCmdExitSignal PostJobPrio1
    PostJobPrio2 PreCmdExitCode PreCmdExitSignal PreJobPrio1 PreJobPrio2 ProcId
    ProportionalSetSizeKb RecentBlockReadKbytes RecentBlockReads RecentBlockWriteKbytes
    RecentBlockWrites RecentStatsLifetimeStarter RemoteSlotID RemoteSysCpu RemoteUserCpu
    RemoteWallClockTime RequestCpus RequestDisk RequestGpus RequestMemory RequestVirtualMemory
    ResidentSetSize ResidentSetSize_RAW ScratchDirFileCount StackSize StatsLifetimeStarter
    SuccessCheckpointExitCode SuccessCheckpointExitSignal SuccessPostExitCode
    SuccessPostExitSignal SuccessPreExitCode SuccessPreExitSignal TotalSubmitProcs
    TotalSuspensions TransferInputSizeMB WallClockCheckpoint WindowsBuildNumber
    WindowsMajorVersion WindowsMinorVersion""")

DATE = _names("""CompletionDate EnteredCurrentStatus GLIDEIN_ToDie GLIDEIN_ToRetire
    JobCurrentFinishTransferInputDate JobCurrentFinishTransferOutputDate JobCurrentStartDate
    JobCurrentStartExecutingDate JobCurrentStartTransferInputDate
    JobCurrentStartTransferOutputDate JobDisconnectedDate JobFinishedHookDone JobLastStartDate
    JobLeaseExpiration JobQueueBirthdate JobStartDate LastJobLeaseRenewal LastMatchTime
    LastRejMatchTime LastRemoteStatusUpdate LastSuspensionTime LastVacateTime
    LastVacateTime_RAW MATCH_GLIDEIN_ToDie MATCH_GLIDEIN_ToRetire QDate RecordTime ShadowBday
    StageInFinish StageInStart StageOutFinish StageOutStart TransferInFinished TransferInQueued
    TransferInStarted TransferOutFinished TransferOutQueued TransferOutStarted""")

BOOL = _names("""BufferFiles CurrentStatusUnknown DataflowJobSkipped DockerOverrideEntrypoint
    EncryptExecuteDirectory EraseOutputAndErrorOnRestart ExitBySignal GlobusResubmit IsNoopJob
    JobCoreDumped LeaveJobInQueue LoadProfile ManifestDesired NiceUser Nonessential OnExitHold
    OnExitRemove PeriodicHold PeriodicRelease PeriodicRemove PostCmdExitBySignal
    PreCmdExitBySignal PreserveRelativeExecutable PreserveRelativePaths RunAsOwner
    SendCredential SkipIfDataflow SpoolOnEvict StreamIn StreamErr StreamOut
    SuccessCheckpointExitBySignal SuccessPostExitBySignal SuccessPreExitBySignal
    TerminationPending TransferErr TransferExecutable TransferIn TransferOut TransferQueued
    TransferringInput TransferringOutput Use_x509UserProxy UserLogUseXML WantAdRevaluate
    WantCheckpoint WantCheckpointSignal WantClaiming WantCompletionVisaFromSchedD
    WantDelayedUpdates WantExecutionVisaFromStarter WantFTOnCheckpoint WantGracefulRemoval
    WantIOProxy WantMatchDiagnostics WantMatching WantParallelScheduling
    WantParallelSchedulingGroups WantPslotPreemption WantRemoteIO WantRemoteSyscalls
    WantRemoteUpdates WantResAd""")

NESTED = _names("DAG_Stats NumHoldsByReason ToE TransferInputStats TransferOutputStats metadata")

IGNORE = _names("""AzureAdminKey AzureAdminUsername AzureAuthFile ClaimId CmdHash EC2AccessKeyId
    EC2KeyPair EC2KeyPairFile EC2SecretAccessKey EC2SecurityGroups EC2SecurityIDs EC2UserData
    EC2UserDataFile Env EnvDelim Environment ExecutableSize GceAccount GceAuthFile GceJsonFile
    GceMetadataFile GlideinCredentialIdentifier GlideinSecurityClass JobCoreFileName
    JobNotification KeystoreAlias KeystoreFile KeystorePassphraseFile LastPublicClaimId PostArgs
    PostArguments PostEnv PostEnvironment PreArgs PreArguments PreEnv PreEnvironment
    PublicClaimId ScitokensFile SpooledOutputFiles orig_environment osg_environment""")

STATUS = {0: "Unexpanded", 1: "Idle", 2: "Running", 3: "Removed", 4: "Completed", 5: "Held",
          6: "Error"}
UNIVERSE = {1: "Standard", 2: "Pipe", 3: "Linda", 4: "PVM", 5: "Vanilla", 6: "PVMD",
            7: "Scheduler", 8: "MPI", 9: "Grid", 10: "Java", 11: "Parallel", 12: "Local"}

KNOWN = TEXT | INDEXED_KEYWORD | NOINDEX_KEYWORD | FLOAT | INT | DATE | BOOL | NESTED | IGNORE
